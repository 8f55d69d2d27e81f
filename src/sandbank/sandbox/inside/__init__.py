"""Code that runs inside a sandbox (standard library only) and the wire protocol of both ends."""
