#!/usr/bin/env bash
# Render a run's report (`reinforge report RUN_DIR`) and screenshot it with headless Chromium.
#
#   scripts/report_screenshot.sh RUN_DIR OUT.png [WIDTH [HEIGHT]]
#
# WIDTH x HEIGHT is the browser window in CSS pixels (default 1400 x 1500): the PNG shows the top
# of the page, the curves first. The PNG is reduced to a 256-colour palette (Pillow, installed
# with reinforge's matplotlib): plots have few colours, and the file shrinks about 3x, small
# enough for docs. Needs Chromium (Debian/Ubuntu: `apt-get install -y chromium`).
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 4 ]; then
    echo "usage: $0 RUN_DIR OUT.png [WIDTH [HEIGHT]]" >&2
    exit 2
fi
run_dir=$1
out=$2
width=${3:-1400}
height=${4:-1500}

browser=""
for name in chromium chromium-browser google-chrome; do
    if command -v "$name" >/dev/null 2>&1; then
        browser=$name
        break
    fi
done
if [ -z "$browser" ]; then
    echo "$0: headless Chromium is needed: apt-get install -y chromium" >&2
    exit 1
fi

here=$(cd "$(dirname "$0")/.." && pwd)
reinforge=$(command -v reinforge || echo "$here/.venv/bin/reinforge")
html=$("$reinforge" report "$run_dir")

# Chromium refuses to start as root with its sandbox on (containers, CI).
sandbox=()
if [ "$(id -u)" = 0 ]; then
    sandbox=(--no-sandbox)
fi
out_abs=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
"$browser" --headless=new "${sandbox[@]}" --disable-gpu --hide-scrollbars --mute-audio \
    --window-size="$width,$height" --screenshot="$out_abs" "file://$(cd "$(dirname "$html")" && pwd)/index.html" \
    >/dev/null 2>&1
test -s "$out_abs"
python=$(dirname "$reinforge")/python
[ -x "$python" ] || python=python3
"$python" - "$out_abs" <<'EOF'
import sys
from PIL import Image

Image.open(sys.argv[1]).convert("RGB").quantize(256).save(sys.argv[1], optimize=True)
EOF
echo "$out_abs"
