#!/usr/bin/env bash
# Debian packages some tests use, installed when missing and the machine allows it (root + apt).
# Never fails: the tests that need a package skip without it, and say so.
#   libb64-0d:  Triton's perf_analyzer (tests/compat/test_perf_analyzer_compat.py, make bench)
#   prometheus: promtool, for `promtool check rules` / `promtool test rules` on the alerts
#               (tests/manifests/test_observability_rules.py). The package also ships the Prometheus
#               server; where systemd runs, its service is stopped and disabled again right away.
#   chromium, chromium-driver: headless Chromium and its WebDriver, for the trace UI's browser test
#               (tests/compat/test_trace_ui.py, driven by selenium).
set -u
missing=()
ldconfig -p 2>/dev/null | grep -q 'libb64\.so' || missing+=(libb64-0d)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "note: ${missing[*]} missing and cannot be installed here; tests that need it will skip"
  exit 0
fi
echo "installing ${missing[*]}"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1; } \
  || echo "note: could not install ${missing[*]}; tests that need it will skip"
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
exit 0
