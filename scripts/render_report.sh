#!/usr/bin/env bash
# Renders a `zeroplan report` page in headless Chromium: one screenshot per view (and one
# of the top of the page), and the time the page takes to load and lay out. Installs
# Debian's chromium when it is missing (as root, or with sudo).
#
#   bash scripts/render_report.sh PAGE.html OUTDIR [WIDTH]
#
# OUTDIR gets top.png, one VIEW.png per view present, and load.txt.
set -euo pipefail

page=${1:?usage: render_report.sh PAGE.html OUTDIR [WIDTH]}
out=${2:?usage: render_report.sh PAGE.html OUTDIR [WIDTH]}
width=${3:-1200}

if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "render_report: installing chromium"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi

mkdir -p "$out"
abs=$(realpath "$page")
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
# Offline, as a reader would open it: no network, a throw-away profile.
chrome=(chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --disable-extensions
        --user-data-dir="$profile" --proxy-server=127.0.0.1:9 --force-device-scale-factor=1
        --allow-file-access-from-files)

# A view is shot through a frame opened at its anchor (headless screenshots do not scroll).
shot() {  # shot NAME HEIGHT ANCHOR
  local frame="$profile/frame-$1.html"
  printf '<!DOCTYPE html><html><body style="margin:0"><iframe src="file://%s%s" style="width:%spx;height:%spx;border:0">' \
    "$abs" "$3" "$width" "$2" >"$frame"
  printf '</iframe></body></html>\n' >>"$frame"
  "${chrome[@]}" --window-size="$width,$2" --virtual-time-budget=10000 --screenshot="$out/$1.png" "file://$frame" \
    >/dev/null 2>&1
  echo "render_report: $out/$1.png"
}

shot top 1000 ""
for view in memory-per-stage memory-over-step step-timeline plan-candidates measured-vs-predicted; do
  if grep -q "data-view=\"$view\"" "$abs"; then shot "$view" 1100 "#$view"; fi
done

# Load time: a page that opens the report in a frame and, once it has loaded, forces a
# layout of the whole document; Chromium prints the resulting DOM with the times.
probe="$profile/probe.html"
cat >"$probe" <<EOF
<!DOCTYPE html><html><head><title>probe</title></head><body>
<iframe id="f" style="width:${width}px;height:900px;border:0"></iframe>
<script>
const t0 = performance.now();
const f = document.getElementById('f');
f.onload = () => {
  const loaded = performance.now() - t0;
  const h = f.contentDocument.documentElement.scrollHeight;
  const laid = performance.now() - t0;
  document.title = 'loaded ' + loaded.toFixed(0) + ' ms, laid out ' + laid.toFixed(0) + ' ms, height ' + h + ' px';
};
f.src = 'file://$abs';
</script></body></html>
EOF
result=$("${chrome[@]}" --window-size="$width,1000" --virtual-time-budget=60000 --dump-dom "file://$probe" 2>/dev/null |
         sed -n 's:.*<title>\(.*\)</title>.*:\1:p')
size=$(stat -c %s "$abs")
echo "$abs: $size bytes; $result" | tee "$out/load.txt"
