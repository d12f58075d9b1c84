#!/usr/bin/env bash
# Make sure Debian's Chromium is installed for the dashboard's browser test (Playwright drives it by
# executable path; it never downloads a browser). Installs it with apt-get when run as root;
# otherwise says exactly what to run.
set -euo pipefail

chromium=${RESONTECH_CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "==> installing Debian's chromium for the browser test (once)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq chromium >/dev/null
  [ -x "$chromium" ] && exit 0
fi
echo "error: the browser test needs Chromium at $chromium: run 'sudo apt-get install chromium'" >&2
echo "       (or point RESONTECH_CHROMIUM at a Chromium binary)" >&2
exit 1
