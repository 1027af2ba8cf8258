"""Kafka v2 record batches: the header (`header`), records (`codec`), codecs (`compression`)."""
