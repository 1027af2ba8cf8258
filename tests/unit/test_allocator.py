"""eos.allocator: glibc's thresholds raised once a process, unless the operator set them.

Each case runs in a fresh interpreter: the thresholds are set once a process, and the test
process has set them already if any test made a Producer or Consumer in it. What is observed is glibc's own
count of mmapped chunks (mallinfo2().hblks): a 2 MiB buffer is one of them under glibc's
defaults, and comes from the heap once the thresholds are raised.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                                reason="mallopt and mallinfo2 are glibc's")

# Prints {"set": <what the call returned, or null>, "mmapped_by_2_mib": <new mmapped chunks>}.
PROBE = """
import ctypes, json, sys
from eos import allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
step = sys.argv[1]
result = None
if step == "call":
    result = allocator.keep_large_buffers_in_the_heap(allocator.CLIENT_THRESHOLD_BYTES)
elif step == "call-twice":
    allocator.keep_large_buffers_in_the_heap(allocator.CLIENT_THRESHOLD_BYTES)
    result = allocator.keep_large_buffers_in_the_heap(allocator.CLIENT_THRESHOLD_BYTES)
elif step == "producer":
    import eos
    producer = eos.Producer("127.0.0.1:9", max_block_ms=100)
    producer.close(timeout=1)
elif step == "consumer":
    import eos
    eos.Consumer("127.0.0.1:9").close()
elif step == "broker":
    import shutil, tempfile
    from broker.server import BrokerServer
    data_dir = tempfile.mkdtemp()
    BrokerServer(data_dir, port=0).start().stop()
    shutil.rmtree(data_dir)
before = libc.mallinfo2().hblks
buffer = bytearray(2 * 1024 * 1024)
after = libc.mallinfo2().hblks
print(json.dumps({"set": result, "mmapped_by_2_mib": after - before}))
"""


def _probe(step: str, **environment: str) -> dict:
    env = {name: value for name, value in os.environ.items()
           if name not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")}
    env.update(environment)
    env["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run([sys.executable, "-c", PROBE, step], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_glibc_defaults_map_a_2_mib_buffer_of_its_own():
    # the baseline the other cases change: without the call the buffer is mmapped
    assert _probe("none") == {"set": None, "mmapped_by_2_mib": 1}


def test_the_call_keeps_a_2_mib_buffer_in_the_heap():
    assert _probe("call") == {"set": True, "mmapped_by_2_mib": 0}


def test_only_the_first_call_sets_the_thresholds():
    assert _probe("call-twice") == {"set": False, "mmapped_by_2_mib": 0}


@pytest.mark.parametrize("environment", [
    {"MALLOC_MMAP_THRESHOLD_": "131072"},
    {"MALLOC_TRIM_THRESHOLD_": "131072"},
    {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"},
    {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=131072"},
])
def test_thresholds_the_operator_set_stand(environment):
    assert _probe("call", **environment) == {"set": False, "mmapped_by_2_mib": 1}


def test_other_malloc_tunables_do_not_count_as_the_operators_thresholds():
    assert _probe("call", GLIBC_TUNABLES="glibc.malloc.arena_max=2") == {"set": True, "mmapped_by_2_mib": 0}


@pytest.mark.parametrize("client", ["producer", "consumer"])
def test_a_client_raises_them_for_its_requests_and_fetch_answers(client):
    assert _probe(client)["mmapped_by_2_mib"] == 0


def test_a_broker_raises_them_as_it_starts_in_a_process_of_its_own_or_embedded():
    assert _probe("broker")["mmapped_by_2_mib"] == 0
