"""The group coordinator's pure cores: membership (`state`), committed offsets (`offsets`) and
the `__consumer_offsets` record codec (`records`). No I/O, no threads: a service shell drives
them with requests and the time, and carries out the writes they ask for."""
