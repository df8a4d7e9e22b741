#!/usr/bin/env bash
# Installs Debian's chromium for the browser tests (tests/browser), if it is missing.
# Idempotent: does nothing when /usr/bin/chromium is there. Never downloads Playwright's own
# browsers (`playwright install`): the tests drive /usr/bin/chromium through Python Playwright.
# Without root and without chromium it only says so; the browser tests then skip.
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
	echo "install-browser: $CHROMIUM present ($("$CHROMIUM" --version 2>/dev/null || echo 'version unknown')); nothing to do"
	exit 0
fi

if [ "$(id -u)" != 0 ]; then
	echo "install-browser: $CHROMIUM missing and not root; not installing (browser tests will skip)." >&2
	echo "install-browser: as root: apt-get update && apt-get install -y chromium" >&2
	exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-browser: $CHROMIUM missing and no apt-get; not installing (browser tests will skip)." >&2
	exit 0
fi

echo "install-browser: installing chromium with apt-get"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium
echo "install-browser: installed $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")"
