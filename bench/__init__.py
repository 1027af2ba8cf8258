"""Benchmarks of eos against Apache Kafka on the same machine: `python -m bench` (README.md)."""
