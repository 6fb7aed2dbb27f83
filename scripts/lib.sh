# Shared by scripts/demo and scripts/test: install what is missing, from
# Debian's packages and PyPI, as root or through sudo.

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=
# need_package [--alone] PACKAGE WHY TEST...: installs PACKAGE unless TEST
# succeeds; --alone: without the packages it recommends (mdadm's bring a
# mail server).
need_package() {
  local alone=()
  if [ "$1" = --alone ]; then
    alone=(--no-install-recommends)
    shift
  fi
  local package=$1 why=$2
  shift 2
  if "$@" >/dev/null 2>&1; then
    return 0
  fi
  echo "shepherd: installing Debian's $package ($why)" >&2
  if [ -z "$apt_updated" ]; then
    as_root apt-get update -qq
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${alone[@]}" "$package" >/dev/null
}

has_postgres_server() {
  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null 2>&1
}

need_postgres_server() {
  need_package postgresql "the embedded BMDB runs PostgreSQL's server binaries" has_postgres_server
}

need_rust() {
  if ! command -v cargo >/dev/null 2>&1; then
    echo "shepherd: cargo is missing: install Rust (https://rustup.rs), then run this again" >&2
    exit 1
  fi
}

# The outside implementations the tests check against: Equinix's Python SDK
# (0.19.0 is the last release with equinix.services.metalv1), the
# Prometheus project's Python client (its OpenMetrics parser reads
# /metrics), OpenStack's Redfish emulator (sushy-tools, the BMCs) and
# Selenium (drives Chromium through chromedriver on the admin pages) and
# schemathesis (checks the admin API against its OpenAPI description).
PYTHON_PACKAGES=('equinix==0.19.0' 'prometheus-client==0.26.0' 'sushy-tools==2.2.0' 'selenium==4.27.1' 'schemathesis==4.32.5')
need_python_packages() {
  if python3 -c "import equinix.services.metalv1, prometheus_client.openmetrics.parser, sushy_tools.emulator.main, bcrypt, selenium.webdriver, schemathesis.cli" >/dev/null 2>&1; then
    return 0
  fi
  echo "shepherd: installing ${PYTHON_PACKAGES[*]} (outside implementations the tests check against)" >&2
  local user=
  [ "$(id -u)" = 0 ] || user=--user
  # Debian's own python3 refuses pip installs (PEP 668) unless told.
  python3 -m pip install -q $user --disable-pip-version-check "${PYTHON_PACKAGES[@]}" 2>/dev/null ||
    python3 -m pip install -q $user --disable-pip-version-check --break-system-packages "${PYTHON_PACKAGES[@]}"
}

# Stoplight's Prism (npm), the validating proxy the Metal API's SDK test
# runs every exchange through (against the shared OpenAPI description):
# 5.14.2, the last release that runs on Node 20; installed once under
# /var/tmp, its path exported as SHEPHERD_PRISM.
PRISM_VERSION=5.14.2
need_prism() {
  local dir=${SHEPHERD_PRISM_DIR:-/var/tmp/shepherd-prism-$PRISM_VERSION-$(id -u)}
  local bin=$dir/node_modules/.bin/prism
  if [ ! -x "$bin" ]; then
    need_package npm "Prism (the OpenAPI validating proxy) is installed with npm" command -v npm
    echo "shepherd: installing @stoplight/prism-cli@$PRISM_VERSION (npm) into $dir" >&2
    mkdir -p "$dir"
    npm install --silent --no-audit --no-fund --prefix "$dir" "@stoplight/prism-cli@$PRISM_VERSION" >/dev/null
  fi
  export SHEPHERD_PRISM=$bin
}

# libvirt and QEMU, with libvirtd running (started by hand where nothing
# else does, as Metal3's CI runs it), and VirtualBMC from PyPI (the IPMI
# emulator Ironic's and Metal3's CI use) with libvirt's Python binding.
need_virtualbmc() {
  need_package qemu-system-x86 "the IPMI tests' machine is a libvirt domain under QEMU" command -v qemu-system-x86_64
  need_package libvirt-daemon-system "VirtualBMC drives libvirt domains" command -v libvirtd
  need_package libvirt-dev "libvirt-python is built against it" test -e /usr/include/libvirt/libvirt.h
  need_package pkg-config "libvirt-python's build finds libvirt with it" command -v pkg-config
  if ! python3 -c 'import libvirt, virtualbmc' 2>/dev/null; then
    echo "shepherd: installing virtualbmc and libvirt-python (PyPI), the IPMI tests' BMC" >&2
    local user=
    [ "$(id -u)" = 0 ] || user=--user
    python3 -m pip install -q $user --disable-pip-version-check 'virtualbmc==3.3.0' 'libvirt-python==11.*' 2>/dev/null ||
      python3 -m pip install -q $user --disable-pip-version-check --break-system-packages 'virtualbmc==3.3.0' 'libvirt-python==11.*'
  fi
  if [ "$(id -u)" = 0 ]; then
    pgrep -x virtlogd >/dev/null || virtlogd -d 9>&-
    pgrep -x libvirtd >/dev/null || libvirtd -d 9>&-
    local i
    for i in $(seq 50); do virsh -q list >/dev/null 2>&1 && break; sleep 0.2; done
  fi
}

# console_has FILE OFFSET PATTERN: whether FILE, from byte OFFSET on,
# holds a line matching PATTERN (grep -E). grep reads it to the end: a
# `tail | grep -q` under pipefail fails when grep stops early and tail
# dies of SIGPIPE, which a large console makes likely.
console_has() {
  tail -c +$(($2 + 1)) "$1" | grep -a -E -- "$3" >/dev/null
}

# A TCP port free on 127.0.0.1 now (for the VM scripts' forwards).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# cached_tree DEST KEY CMD...: DEST as CMD builds it (CMD writes DEST and
# marks it done with DEST/.done), or a copy of the one an earlier run built
# under KEY in $SHEPHERD_VM_CACHE (CI sets it: the guests' root filesystems
# are built once per content and reused). KEY names the content: callers
# hash what the tree is built from into it.
cached_tree() {
  local dest=$1 key=$2
  shift 2
  local cache=${SHEPHERD_VM_CACHE:-}
  if [ -n "$cache" ] && [ -e "$cache/$key/.done" ]; then
    echo "shepherd: $dest from the cache ($cache/$key)" >&2
    rm -rf "$dest"
    cp -a "$cache/$key" "$dest"
    return 0
  fi
  "$@"
  if [ -n "$cache" ] && [ -e "$dest/.done" ]; then
    mkdir -p "$cache"
    rm -rf "$cache/$key.partial"
    cp -a "$dest" "$cache/$key.partial" && mv "$cache/$key.partial" "$cache/$key"
    # Older contents of the same tree are of no more use.
    local k
    for k in "$cache/${key%-*}"-*; do
      [ "$k" = "$cache/$key" ] || rm -rf "$k"
    done
  fi
}

# content_key NAME TEXT...: NAME and a digest of the texts a tree is
# built from.
content_key() {
  local name=$1
  shift
  printf '%s\n' "$@" | sha256sum | cut -c1-16 | sed "s/^/$name-/"
}

# sushy-tools' libvirt driver's settings for OVMF's 4M builds: the Secure
# Boot capable firmware (it needs SMM: the domain's <smm state='on'/>),
# and the NVRAM templates Redfish's SecureBootEnable switches between
# (Microsoft's keys enrolled, or none).
sushy_ovmf_settings() {
  cat <<'CONF'
SUSHY_EMULATOR_BOOT_LOADER_MAP = {
    'UEFI': {'x86_64': '/usr/share/OVMF/OVMF_CODE_4M.ms.fd'},
    'Legacy': {'x86_64': None}}
SUSHY_EMULATOR_SECURE_BOOT_ENABLED_NVRAM = '/usr/share/OVMF/OVMF_VARS_4M.ms.fd'
SUSHY_EMULATOR_SECURE_BOOT_DISABLED_NVRAM = '/usr/share/OVMF/OVMF_VARS_4M.fd'
CONF
}

# libvirt's daemons for the guests, started here when not running, and
# its `default` storage pool (sushy-tools keeps inserted media there).
# QEMU's seccomp sandbox is turned off: the guests' forwards spawn socat.
start_libvirt() {
  local pool=${POOL:-/var/lib/libvirt/images} n
  if ! grep -q '^seccomp_sandbox = 0' /etc/libvirt/qemu.conf 2>/dev/null; then
    echo "shepherd: libvirt: seccomp_sandbox = 0 in /etc/libvirt/qemu.conf (the forwards spawn socat)" >&2
    echo 'seccomp_sandbox = 0' >> /etc/libvirt/qemu.conf
    # Stopped, and gone, before it is started again.
    if pkill -x libvirtd 2>/dev/null; then
      for n in $(seq 50); do pgrep -x libvirtd >/dev/null || break; sleep 0.2; done
    fi
  fi
  # Without the lock's descriptor: a daemon left running must not hold it.
  pgrep -x virtlogd >/dev/null || virtlogd -d 9>&-
  pgrep -x libvirtd >/dev/null || libvirtd -d 9>&-
  for n in $(seq 50); do virsh -q list >/dev/null 2>&1 && break; sleep 0.2; done
  virsh -q list >/dev/null
  if ! virsh -q pool-info default >/dev/null 2>&1; then
    mkdir -p "$pool"
    virsh -q pool-define-as default dir --target "$pool" >/dev/null
  fi
  virsh -q pool-start default >/dev/null 2>&1 || true
}

# A guest stopped and gone with every NVRAM it had: sushy-tools keeps one
# file per Secure Boot state (`_VARS.secboot.fd`, `_VARS.nosecboot.fd`)
# and `undefine --nvram` removes the current one only; a file left from
# an earlier run would be this run's firmware settings.
remove_domain() {
  virsh -q destroy "$1" >/dev/null 2>&1 || true
  virsh -q undefine --nvram "$1" >/dev/null 2>&1 || true
  rm -f /var/lib/libvirt/qemu/nvram/"$1"_VARS*.fd
}
