#!/usr/bin/env bash
# Screenshot reports/index.html in headless Chromium with the network off (proves it renders offline).
#   scripts/screenshot_report.sh [HTML] [PNG] [WIDTHxHEIGHT]
# Needs Debian's `chromium` (apt-get install chromium fonts-noto-cjk; the CJK font renders the Chinese text).
set -euo pipefail
html=$(realpath "${1:-reports/index.html}")
png=${2:-reports/index.png}
size=${3:-1400x4200}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
    echo "no chromium found: apt-get install chromium fonts-noto-cjk" >&2
    exit 2
fi
mkdir -p "$(dirname "$png")"
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
# --proxy-server to a closed port: any attempt to fetch from the network fails, so what renders is the file alone.
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" \
    --proxy-server="http://127.0.0.1:9" --proxy-bypass-list="<-loopback>" \
    --window-size="${size/x/,}" --screenshot="$(realpath -m "$png")" "file://$html" 2>/dev/null
test -s "$png" && echo "wrote $png"
