# Sourced by the bootstrap scripts: apt_install CALLER PACKAGE... installs the packages that are not yet
# installed (needs root) and sets APT_INSTALLED=1 when it installed any, 0 otherwise.
apt_install() {
  local caller=$1 p
  shift
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  APT_INSTALLED=0
  [ "${#missing[@]}" -gt 0 ] || return 0
  if [ "$(id -u)" -ne 0 ]; then echo "$caller: need root to apt-get install ${missing[*]}" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  APT_INSTALLED=1
}
