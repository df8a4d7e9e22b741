#!/usr/bin/env bash
# Installs Debian's Node.js for building the JupyterLab extension (labextension/), if missing.
# Idempotent: does nothing when a `node` of at least 20.19 is on PATH (the extension builder,
# rspack, needs it). jlpm, the package manager, comes with JupyterLab in the venv; npm is not
# needed. Without root it only says so; `make setup` then skips the extension build.
set -euo pipefail

MIN_MAJOR=20
MIN_MINOR=19

version_ok() {
	local version major minor
	version=$("$1" --version 2>/dev/null | sed 's/^v//') || return 1
	major=${version%%.*}
	minor=${version#*.}
	minor=${minor%%.*}
	[ -n "$major" ] && { [ "$major" -gt "$MIN_MAJOR" ] || { [ "$major" -eq "$MIN_MAJOR" ] && [ "$minor" -ge "$MIN_MINOR" ]; }; }
}

if command -v node >/dev/null 2>&1 && version_ok node; then
	echo "install-node: $(command -v node) $(node --version) present; nothing to do"
	exit 0
fi

if [ "$(id -u)" != 0 ]; then
	echo "install-node: Node.js >= $MIN_MAJOR.$MIN_MINOR missing and not root; not installing (the lab extension will not be built)." >&2
	echo "install-node: as root: apt-get update && apt-get install -y nodejs" >&2
	exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-node: Node.js missing and no apt-get; not installing (the lab extension will not be built)." >&2
	exit 0
fi

echo "install-node: installing nodejs with apt-get"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq nodejs
if version_ok node; then
	echo "install-node: installed $(node --version)"
else
	echo "install-node: apt's nodejs is $(node --version 2>/dev/null || echo missing); the extension needs >= $MIN_MAJOR.$MIN_MINOR" >&2
fi
