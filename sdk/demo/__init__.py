"""`make demo`: the reference guide's account cleanup, end to end against a real undolog
server, with the SDK and a scripted agent. Not part of the installable package.

    python -m sdk.demo [--own-server] [--interactive] [--url URL]

See sdk/README.md ("The demo").
"""
