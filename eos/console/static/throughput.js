// Polls the console's throughput JSON and draws the total records/s as an SVG line, with
// the current rate of each topic in a table. No library: one request per sampling interval
// (data-poll-ms: the server samples no more often than that anyway).
(function () {
  var POLL_MS = Number(document.currentScript.dataset.pollMs) || 1000;
  var WIDTH = 800, HEIGHT = 240, MARGIN = 10;
  var source = document.currentScript.dataset.source;
  var line = document.getElementById("throughput-line");
  var now = document.getElementById("throughput-now");
  var peak = document.getElementById("throughput-peak");
  var rows = document.querySelector("#throughput-topics tbody");

  function draw(series) {
    var points = series.points;
    if (points.length === 0) return;
    var rates = points.map(function (p) { return p.records_per_s; });
    var top = Math.max.apply(null, rates.concat([1]));
    var first = points[0].time_ms, span = Math.max(points[points.length - 1].time_ms - first, 1);
    line.setAttribute("points", points.map(function (p) {
      var x = MARGIN + (p.time_ms - first) / span * (WIDTH - 2 * MARGIN);
      var y = HEIGHT - MARGIN - p.records_per_s / top * (HEIGHT - 2 * MARGIN);
      return x.toFixed(1) + "," + y.toFixed(1);
    }).join(" "));
    var last = points[points.length - 1];
    now.textContent = last.records_per_s;
    peak.textContent = Math.max.apply(null, rates);
    rows.replaceChildren.apply(rows, Object.keys(last.topics).sort(function (a, b) {
      return last.topics[b] - last.topics[a];
    }).map(function (topic) {
      var tr = document.createElement("tr");
      [topic, last.topics[topic]].forEach(function (text) {
        var td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      });
      return tr;
    }));
  }

  function poll() {
    fetch(source, { headers: { "Accept": "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (series) { if (series) draw(series); })
      .catch(function () { /* the console is restarting: try again next time */ })
      .finally(function () { setTimeout(poll, POLL_MS); });
  }
  poll();
}());
