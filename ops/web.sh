#!/usr/bin/env bash
# Install the dashboard's front-end dependencies (uPlot, its charts) from the npm registry, exactly as
# ops/web/package-lock.json pins them, into a shared folder keyed by the lock's hash (a fresh clone
# with an unchanged lock installs nothing), and copy the files the page loads into
# gateway/dashboard/static/ (uplot.js, uplot.css; not committed). Installs Node.js's npm with apt-get
# when it is missing and this runs as root; otherwise says what to run.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
web=ops/web
static=gateway/dashboard/static
hash=$(cat "$web/package.json" "$web/package-lock.json" | sha256sum | cut -c1-16)
cache=${RESONTECH_WEB:-$HOME/.cache/resontech/web}/$hash

if [ ! -f "$cache/.done" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "==> installing npm (once)"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >/dev/null
      apt-get install -y -qq npm >/dev/null
    else
      echo "error: npm is missing (the dashboard's charts come from the npm registry):" >&2
      echo "       run 'sudo apt-get install npm'" >&2
      exit 1
    fi
  fi
  echo "==> installing the dashboard's charting library (uPlot, pinned by $web/package-lock.json)"
  rm -rf "$cache"
  mkdir -p "$cache"
  cp "$web/package.json" "$web/package-lock.json" "$cache/"
  (cd "$cache" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
  touch "$cache/.done"
fi

dist=$cache/node_modules/uplot/dist
cmp -s "$dist/uPlot.esm.js" "$static/uplot.js" || cp "$dist/uPlot.esm.js" "$static/uplot.js"
cmp -s "$dist/uPlot.min.css" "$static/uplot.css" || cp "$dist/uPlot.min.css" "$static/uplot.css"
