"""Regenerate the Python stubs of the wire contract into eos/v1/.

    python proto/generate.py          # write eos/v1/*_pb2*.py
    python proto/generate.py --check  # exit 1 when the checked-in stubs are stale

The stubs are checked in so that installing eos needs no protoc; CI runs --check so that a
change to proto/ without regenerating fails loudly.
"""
from __future__ import annotations

import argparse
import filecmp
import pathlib
import shutil
import sys
import tempfile

from grpc_tools import protoc

REPO = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "proto"
OUT_PACKAGE = REPO / "eos" / "v1"


def generate(out_root: pathlib.Path) -> list[pathlib.Path]:
    sources = sorted((PROTO_ROOT / "eos" / "v1").glob("*.proto"))
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out_root}",
            f"--pyi_out={out_root}", f"--grpc_python_out={out_root}"]
    args += [str(s.relative_to(PROTO_ROOT)) for s in sources]
    # protoc resolves the relative source paths against the -I root.
    rc = _run_in(PROTO_ROOT, args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    return sorted((out_root / "eos" / "v1").glob("*_pb2*.py*"))


def _run_in(cwd: pathlib.Path, args: list[str]) -> int:
    import os
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return protoc.main(args)
    finally:
        os.chdir(old)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when eos/v1 is stale")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_root = pathlib.Path(tmp)
        generated = generate(tmp_root)
        stale = []
        for path in generated:
            target = OUT_PACKAGE / path.name
            if not target.exists() or not filecmp.cmp(path, target, shallow=False):
                stale.append(path.name)
            if not options.check:
                shutil.copyfile(path, target)
        expected = {p.name for p in generated}
        extra = [p.name for p in OUT_PACKAGE.glob("*_pb2*.py*") if p.name not in expected]
        if options.check:
            if stale or extra:
                print(f"stale generated stubs in eos/v1: {stale + extra}; "
                      "run: python proto/generate.py", file=sys.stderr)
                return 1
            print("eos/v1 stubs are current")
            return 0
        for name in extra:
            (OUT_PACKAGE / name).unlink()
        print(f"wrote {len(generated)} files into eos/v1")
        return 0


if __name__ == "__main__":
    sys.exit(main())
