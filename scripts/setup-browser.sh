#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the web page's browser test
# (crates/cli/tests/web_page.rs): Debian's `chromium` and `chromium-driver` from apt.
# Nothing at run time needs them.
set -euo pipefail
if command -v chromedriver >/dev/null && { command -v chromium >/dev/null || [ -n "${PYRAMID_CHROMIUM:-}" ]; }; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "the browser test needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver);" \
         "set PYRAMID_CHROMIUM and PYRAMID_CHROMEDRIVER to other installs" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q >/dev/null || true
$sudo apt-get install -y -q chromium chromium-driver >/dev/null
