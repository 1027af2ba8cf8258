// Abort writes an ABORT marker that cannot be taken back: ask first.
document.querySelectorAll("button[data-confirm]").forEach(function (button) {
  button.addEventListener("click", function (event) {
    if (!window.confirm(button.dataset.confirm)) event.preventDefault();
  });
});
