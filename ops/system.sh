#!/usr/bin/env bash
# Make sure the Debian packages the stack and its tests need are installed: bubblewrap (every workload
# runs in its sandbox: agent/sandbox.py) and, with --browser, Chromium (the dashboard's browser test
# drives it through Playwright by executable path; it never downloads a browser). Installs what is
# missing with apt-get when run as root; otherwise says exactly what to run.
set -euo pipefail

chromium=${RESONTECH_CHROMIUM:-/usr/bin/chromium}
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
if [ "${1:-}" = --browser ] && [ ! -x "$chromium" ]; then missing+=(chromium); fi
[ ${#missing[@]} = 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "==> installing ${missing[*]} (once)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${missing[@]}" >/dev/null
  command -v bwrap >/dev/null 2>&1 || { echo "error: bubblewrap did not install" >&2; exit 1; }
  exit 0
fi
echo "error: missing ${missing[*]}: run 'sudo apt-get install ${missing[*]}'" >&2
echo "       (bubblewrap sandboxes every workload; point RESONTECH_CHROMIUM at a Chromium binary if" >&2
echo "       it lives elsewhere)" >&2
exit 1
