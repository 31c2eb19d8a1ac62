#!/usr/bin/env bash
# Install edgeocr as a systemd service.
#   sudo ./jetson/install.sh                 # auto-detects Jetson (JetPack 6) or x86 (RTX 4090D etc.)
#   sudo ./jetson/install.sh --platform x86  # force a platform
#   sudo ./jetson/install.sh --uninstall [--purge]
# Jetson: venv with --system-site-packages (TensorRT's Python bindings ship with JetPack),
# onnxruntime-gpu from NVIDIA's Jetson pip index (not PyPI), pycuda built from source.
# x86: venv with onnxruntime-gpu and the CUDA/cuDNN runtime wheels from PyPI, optional tensorrt_rtx.
set -euo pipefail

PREFIX=/opt/edgeocr
JETSON_PIP_INDEX=${JETSON_PIP_INDEX:-https://pypi.jetson-ai-lab.io/jp6/cu126}
SRC=$(cd "$(dirname "$0")/.." && pwd)
platform=auto; action=install; purge=0
while [ $# -gt 0 ]; do
  case "$1" in
    --platform) platform=$2; shift 2 ;;
    --uninstall) action=uninstall; shift ;;
    --purge) purge=1; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "run as root (sudo)" >&2; exit 1; }

if [ "$action" = uninstall ]; then
  systemctl disable --now edgeocr.service 2>/dev/null || true
  rm -f /etc/systemd/system/edgeocr.service
  rm -rf /etc/systemd/system/edgeocr.service.d "$PREFIX"
  systemctl daemon-reload
  if [ "$purge" = 1 ]; then
    rm -rf /etc/edgeocr /var/lib/edgeocr /var/cache/edgeocr
    userdel edgeocr 2>/dev/null || true
  fi
  echo "edgeocr removed$([ "$purge" = 1 ] && echo ' (with config, artifacts and user)' || echo '; kept /etc/edgeocr and /var/lib/edgeocr (use --purge)')"
  exit 0
fi

if [ "$platform" = auto ]; then
  if [ -f /etc/nv_tegra_release ]; then platform=jetson; else platform=x86; fi
fi
echo "installing edgeocr for $platform from $SRC"

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq python3-venv python3-pip python3-dev >/dev/null

getent group edgeocr >/dev/null || groupadd --system edgeocr
id edgeocr >/dev/null 2>&1 || useradd --system --gid edgeocr --home-dir /var/lib/edgeocr --shell /usr/sbin/nologin edgeocr
for g in video render; do getent group "$g" >/dev/null && usermod -aG "$g" edgeocr; done

mkdir -p "$PREFIX"
case "$platform" in
  jetson)
    grep -q "R36" /etc/nv_tegra_release 2>/dev/null || echo "warning: JetPack 6 (L4T R36) expected" >&2
    python3 -m venv --system-site-packages "$PREFIX/venv"
    "$PREFIX/venv/bin/pip" install -q --upgrade pip
    "$PREFIX/venv/bin/pip" install -q --extra-index-url "$JETSON_PIP_INDEX" onnxruntime-gpu
    export PATH=/usr/local/cuda/bin:$PATH
    "$PREFIX/venv/bin/pip" install -q pycuda || echo "warning: pycuda did not build (needed for TensorRT engines only)" >&2
    "$PREFIX/venv/bin/python" -c "import tensorrt; print('TensorRT', tensorrt.__version__)" \
      || echo "warning: TensorRT Python bindings not found (apt-get install python3-libnvinfer)" >&2
    ;;
  x86)
    command -v nvidia-smi >/dev/null || echo "warning: no NVIDIA driver found (nvidia-smi)" >&2
    python3 -m venv "$PREFIX/venv"
    "$PREFIX/venv/bin/pip" install -q --upgrade pip
    "$PREFIX/venv/bin/pip" install -q "onnxruntime-gpu[cuda,cudnn]"
    "$PREFIX/venv/bin/pip" install -q tensorrt_rtx || echo "note: tensorrt_rtx not installed (optional, RTX GPUs)" >&2
    ;;
  *) echo "unknown platform $platform (jetson or x86)" >&2; exit 2 ;;
esac
"$PREFIX/venv/bin/pip" install -q "$SRC[serve]"

install -d -m 0755 /etc/edgeocr
[ -f /etc/edgeocr/edgeocr.conf ] || install -m 0644 "$SRC/jetson/edgeocr.conf" /etc/edgeocr/edgeocr.conf
install -d -o edgeocr -g edgeocr -m 0750 /var/lib/edgeocr
install -m 0644 "$SRC/jetson/edgeocr.service" /etc/systemd/system/edgeocr.service
systemctl daemon-reload
systemctl enable edgeocr.service >/dev/null
"$PREFIX/venv/bin/edgeocr" doctor --remote "" || true
cat <<MSG

Installed. Next:
  1. put an artifact in /var/lib/edgeocr/artifact (see jetson/README.md), owned by edgeocr
  2. sudo systemctl start edgeocr && journalctl -u edgeocr -f
  3. add client users to the 'edgeocr' group to use /run/edgeocr/edgeocr.sock
MSG
