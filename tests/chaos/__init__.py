"""Chaos tests: real processes killed with kill -9 at random points (after Kafka's
transactions system test); the output must equal the input exactly."""
