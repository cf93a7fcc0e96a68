#!/usr/bin/env bash
# Build slabtune's guest kernels from Debian's linux-source-X packages with a small config of
# the project's own (kernel/configs/), into $cache/kernels/<name>/bzImage with a build.json
# (arch x86), or $cache/kernels/<name>/linux, a User Mode Linux executable (arch um).
#
#   * The kernels, their source packages, suites and config fragments are listed in
#     kernel/configs/kernels.tsv (slabtune.kernel.build reads the same table).
#   * Sources come with `apt-get download` (never installed into /usr/src): from the machine's
#     own apt for its own suite (Debian 12: bookworm), and through a private apt configuration
#     under $cache/apt/<suite>/ for any other suite (unstable), using the mirror the machine's
#     sources point at.  The machine's /etc/apt is read, never written.
#   * Each kernel is configured with `make tinyconfig`, then merge_config.sh with its
#     fragments, then olddefconfig; every line of every fragment must survive in .config.
#     The table's arch column picks make's ARCH: x86 (the default) builds ARCH=x86_64 and
#     keeps arch/x86/boot/bzImage; um builds ARCH=um (on an x86_64 host) and keeps `linux`.
#   * A kernel is rebuilt only when its inputs change: the fragments, this script, the source
#     package and its version (the hash in build.json).  The build tree (out of tree, O=) and
#     the unpacked source are kept, so modules can be built against them later.
#   * Progress goes to stderr; the full output of every step goes to kernels/<name>/build.log.
#
# Usage: scripts/build-kernels.sh [--only NAME[,NAME]] [--cache DIR] [--jobs N]
#                                 [--refresh] [--force]
#        scripts/build-kernels.sh --list
#        scripts/build-kernels.sh --source-version NAME      print the version a build would use
#        scripts/build-kernels.sh --inputs-hash NAME [--version V]
#        scripts/build-kernels.sh --apt-config SUITE        write a private apt config, print it
#        scripts/build-kernels.sh --verify NAME DOTCONFIG    check a .config against NAME's fragments
#   --only NAMES  build only these kernels (default: all of kernels.tsv)
#   --cache DIR   cache directory (default: $SLABTUNE_CACHE, else ~/.cache/slabtune)
#   --jobs N      make -jN (default 2); make runs under nice -n 19
#   --refresh     apt-get update the private apt configurations first
#   --force       rebuild even when build.json says the inputs are unchanged
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
script_path="$repo/scripts/build-kernels.sh"
configs="$repo/kernel/configs"
table="$configs/kernels.tsv"
cache="${SLABTUNE_CACHE:-${HOME}/.cache/slabtune}"
jobs=2
only=""
refresh=0
force=0
mode=build
mode_arg=""
want_version=""

while [ $# -gt 0 ]; do
    case "$1" in
        --only) shift; only="${1:?--only needs kernel names}" ;;
        --cache) shift; cache="${1:?--cache needs a directory}" ;;
        --jobs) shift; jobs="${1:?--jobs needs a number}" ;;
        --refresh) refresh=1 ;;
        --force) force=1 ;;
        --list) mode=list ;;
        --source-version) shift; mode=source-version; mode_arg="${1:?--source-version needs a kernel name}" ;;
        --inputs-hash) shift; mode=inputs-hash; mode_arg="${1:?--inputs-hash needs a kernel name}" ;;
        --version) shift; want_version="${1:?--version needs a version}" ;;
        --apt-config) shift; mode=apt-config; mode_arg="${1:?--apt-config needs a suite}" ;;
        --verify) shift; mode=verify; mode_arg="${1:?--verify needs a kernel name}"
                  shift; verify_file="${1:?--verify needs a .config file}" ;;
        -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
        *) echo "build-kernels: unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
case "$jobs" in ''|*[!0-9]*|0) echo "build-kernels: --jobs: '$jobs' is not a positive integer" >&2; exit 2 ;; esac
cache="$(mkdir -p "$cache" && cd "$cache" && pwd)"
export DEBIAN_FRONTEND=noninteractive LC_ALL=C

log() { echo "build-kernels: $*" >&2; }
die() { echo "build-kernels: error: $*" >&2; exit 1; }

# ------------------------------------------------------------------ the kernel table

declare -A K_PACKAGE K_SUITE K_ALLOC K_FRAGS K_ARCH
K_NAMES=()
while read -r name package suite alloc frags arch rest; do
    case "$name" in ''|'#'*) continue ;; esac
    [ -n "$frags" ] && [ -z "$rest" ] || die "$table: malformed line for '$name'"
    case "${arch:-x86}" in x86|um) ;; *) die "$table: arch '$arch' of '$name' is not x86 or um" ;; esac
    K_NAMES+=("$name")
    K_PACKAGE[$name]="$package"; K_SUITE[$name]="$suite"; K_ALLOC[$name]="$alloc"
    K_FRAGS[$name]="${frags//,/ }"; K_ARCH[$name]="${arch:-x86}"
done < "$table"

# make's ARCH and the image a build keeps (relative to the build tree) for a kernel's arch.
make_arch() { case "${K_ARCH[$1]}" in um) echo um ;; *) echo x86_64 ;; esac; }
image_name() { case "${K_ARCH[$1]}" in um) echo linux ;; *) echo bzImage ;; esac; }
image_in_tree() { case "${K_ARCH[$1]}" in um) echo linux ;; *) echo arch/x86/boot/bzImage ;; esac; }

known() {
    local n
    for n in "${K_NAMES[@]}"; do [ "$n" = "$1" ] && return 0; done
    return 1
}

machine_codename() {
    local c
    c="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
    echo "${c:-bookworm}"
}

# ------------------------------------------------------------------ private apt

# The mirror the machine's own sources use for its own suite (read from apt's view of
# /etc/apt/sources.list and sources.list.d, .list and deb822 alike).
machine_mirror() {
    local codename uri
    codename="$(machine_codename)"
    uri="$(apt-get indextargets --no-release-info --format '$(RELEASE) $(REPO_URI)' \
               'Identifier: Packages' 2>/dev/null | awk -v c="$codename" '$1 == c {print $2; exit}')"
    [ -n "$uri" ] || die "no apt source for the machine's suite '$codename' in /etc/apt/sources.list(.d)"
    echo "$uri"
}

# Write $cache/apt/<suite>/apt.conf: every directory apt reads or writes is under
# $cache/apt/<suite>/; only transport settings (validity checks, proxies) are copied from the
# machine's configuration.  Prints the file's path.
write_apt_config() {
    local suite="$1" d="$cache/apt/$1" mirror keyring
    mirror="$(machine_mirror)"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [ -r "$keyring" ] || die "$keyring is missing (install debian-archive-keyring)"
    mkdir -p "$d/etc/apt.conf.d" "$d/etc/preferences.d" "$d/etc/trusted.gpg.d" \
             "$d/etc/sources.list.d" "$d/etc/auth.conf.d" \
             "$d/state/lists/partial" "$d/cache/archives/partial" "$d/log"
    [ -e "$d/state/status" ] || : > "$d/state/status"
    echo "deb [signed-by=$keyring] $mirror $suite main" > "$d/etc/sources.list.tmp"
    mv "$d/etc/sources.list.tmp" "$d/etc/sources.list"
    {
        echo "// slabtune's private apt configuration for Debian $suite (scripts/build-kernels.sh)."
        echo "Dir::Etc \"$d/etc/\";"
        echo "Dir::Etc::main \"$d/etc/apt.conf.main\";"
        echo "Dir::Etc::Parts \"$d/etc/apt.conf.d/\";"
        echo "Dir::Etc::SourceList \"$d/etc/sources.list\";"
        echo "Dir::Etc::SourceParts \"$d/etc/sources.list.d/\";"
        echo "Dir::Etc::Preferences \"$d/etc/preferences\";"
        echo "Dir::Etc::PreferencesParts \"$d/etc/preferences.d/\";"
        echo "Dir::Etc::Trusted \"$d/etc/trusted.gpg\";"
        echo "Dir::Etc::TrustedParts \"$d/etc/trusted.gpg.d/\";"
        echo "Dir::Etc::netrc \"$d/etc/auth.conf\";"
        echo "Dir::Etc::netrcparts \"$d/etc/auth.conf.d/\";"
        echo "Dir::State \"$d/state/\";"
        echo "Dir::State::status \"$d/state/status\";"
        echo "Dir::Cache \"$d/cache/\";"
        echo "Dir::Log \"$d/log/\";"
        echo "APT::Sandbox::User \"root\";"
        echo "Acquire::Languages \"none\";"
        # Transport settings of the machine (e.g. a frozen mirror needs Check-Valid-Until off).
        apt-config dump 2>/dev/null \
            | grep -E '^Acquire::(Check-Valid-Until|Check-Date|(http|https|ftp)::Proxy) ' || true
    } > "$d/apt.conf.tmp"
    mv "$d/apt.conf.tmp" "$d/apt.conf"
    echo "$d/apt.conf"
}

# apt-get / apt-cache for a suite: the machine's own for its codename, else the private one.
apt_for() {
    local suite="$1"; shift
    if [ "$suite" = "$(machine_codename)" ]; then
        "$@"
    else
        APT_CONFIG="$cache/apt/$suite/apt.conf" "$@"
    fi
}

# Make sure apt can see packages of a suite (update the private lists when missing or asked).
prepare_suite() {
    local suite="$1" conf lists
    if [ "$suite" = "$(machine_codename)" ]; then
        return 0
    fi
    conf="$(write_apt_config "$suite")"
    lists="$cache/apt/$suite/state/lists"
    if [ "$refresh" = 1 ] || ! ls "$lists"/*_Packages* >/dev/null 2>&1; then
        log "apt-get update of the private lists for Debian $suite ($conf)"
        APT_CONFIG="$conf" apt-get update -qq
    fi
}

candidate_version() {
    local suite="$1" package="$2"
    apt_for "$suite" apt-cache policy "$package" 2>/dev/null | awk '/^ *Candidate:/ {print $2; exit}'
}

source_version() {
    local name="$1" v
    prepare_suite "${K_SUITE[$name]}" >&2
    v="$(candidate_version "${K_SUITE[$name]}" "${K_PACKAGE[$name]}")"
    if [ -z "$v" ] || [ "$v" = "(none)" ]; then
        die "$name: apt knows no ${K_PACKAGE[$name]} in Debian ${K_SUITE[$name]}"
    fi
    echo "$v"
}

# ------------------------------------------------------------------ inputs

# The inputs hash (slabtune.kernel.build.inputs_hash computes the same): sha256 of a manifest
# naming the kernel, its package and version, and the sha256 of this script and of each
# fragment in order.
inputs_manifest() {
    local name="$1" version="$2" f
    echo "slabtune-kernel-inputs 1"
    echo "name $name"
    echo "package ${K_PACKAGE[$name]}"
    echo "version $version"
    echo "allocator ${K_ALLOC[$name]}"
    [ "${K_ARCH[$name]}" = x86 ] || echo "arch ${K_ARCH[$name]}"
    echo "file scripts/build-kernels.sh $(sha256sum < "$script_path" | cut -c1-64)"
    for f in ${K_FRAGS[$name]}; do
        [ -r "$configs/$f" ] || die "$name: no config fragment kernel/configs/$f"
        echo "file kernel/configs/$f $(sha256sum < "$configs/$f" | cut -c1-64)"
    done
}

inputs_hash() {
    inputs_manifest "$1" "$2" | sha256sum | cut -c1-64
}

json_str() {
    local s="$1"
    s="${s//\\/\\\\}"; s="${s//\"/\\\"}"
    printf '"%s"' "$s"
}

# A value of build.json (flat, one key a line as this script writes it).
json_field() {
    sed -n "s/^ *\"$2\": \"\\(.*\\)\",\\{0,1\\}\$/\\1/p" "$1" 2>/dev/null | head -n1
}

# Check that every option of the fragments holds in .config (where fragments set the same
# option, the later one wins, as in merge_config.sh): CONFIG_X=v must be there exactly,
# "# CONFIG_X is not set" must not be =y or =m.  Prints each missing one and a count.
verify_config() {
    local cfg="$1"; shift
    local f line sym bad=0 have
    local -A want=() from=()
    local order=()
    for f in "$@"; do
        [ -r "$f" ] || { echo "MISSING fragment $f"; return 1; }
        while IFS= read -r line; do
            case "$line" in
                CONFIG_*=*) sym="${line%%=*}" ;;
                "# CONFIG_"*" is not set") sym="${line#\# }"; sym="${sym%% *}" ;;
                *) continue ;;
            esac
            [ -n "${want[$sym]+set}" ] || order+=("$sym")
            want[$sym]="$line"; from[$sym]="$(basename "$f")"
        done < "$f"
    done
    for sym in "${order[@]}"; do
        line="${want[$sym]}"
        have="$(grep -E "^$sym=" "$cfg" || true)"
        case "$line" in
            CONFIG_*) [ "$have" = "$line" ] && continue ;;
            *) [ -z "$have" ] || [ "$have" = "$sym=n" ] && continue ;;
        esac
        echo "MISSING $line (from ${from[$sym]}; .config has: ${have:-nothing, or not set})"
        bad=1
    done
    echo "checked ${#order[@]} options"
    return $bad
}

# ------------------------------------------------------------------ modes without a build

case "$mode" in
    list)
        for n in "${K_NAMES[@]}"; do
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "${K_PACKAGE[$n]}" "${K_SUITE[$n]}" \
                "${K_ALLOC[$n]}" "${K_FRAGS[$n]}" "${K_ARCH[$n]}"
        done
        exit 0 ;;
    source-version)
        known "$mode_arg" || die "unknown kernel '$mode_arg' (known: ${K_NAMES[*]})"
        source_version "$mode_arg"
        exit 0 ;;
    inputs-hash)
        known "$mode_arg" || die "unknown kernel '$mode_arg' (known: ${K_NAMES[*]})"
        [ -n "$want_version" ] || want_version="$(source_version "$mode_arg")"
        inputs_hash "$mode_arg" "$want_version"
        exit 0 ;;
    apt-config)
        write_apt_config "$mode_arg"
        exit 0 ;;
    verify)
        known "$mode_arg" || die "unknown kernel '$mode_arg' (known: ${K_NAMES[*]})"
        vfrags=()
        for f in ${K_FRAGS[$mode_arg]}; do vfrags+=("$configs/$f"); done
        verify_config "$verify_file" "${vfrags[@]}"
        exit $? ;;
esac

# ------------------------------------------------------------------ build

selected=()
if [ -n "$only" ]; then
    IFS=, read -r -a req <<< "$only"
    for n in "${req[@]}"; do
        known "$n" || die "unknown kernel '$n' (known: ${K_NAMES[*]})"
        selected+=("$n")
    done
else
    selected=("${K_NAMES[@]}")
fi

# Host tools a kernel build needs.
need=()
for t in gcc make flex bison bc perl xz dpkg-deb; do
    command -v "$t" >/dev/null 2>&1 || need+=("$t")
done
[ -e /usr/include/libelf.h ] || need+=(libelf-dev)
if [ ${#need[@]} -gt 0 ]; then
    pkgs=()
    for t in "${need[@]}"; do
        case "$t" in xz) pkgs+=(xz-utils) ;; dpkg-deb) pkgs+=(dpkg) ;; *) pkgs+=("$t") ;; esac
    done
    [ "$(id -u)" = 0 ] || die "missing build tools: ${pkgs[*]} (apt-get install them as root)"
    log "apt-get install ${pkgs[*]}"
    apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null
fi

mkdir -p "$cache/kernels" "$cache/kernel-src"
exec 9> "$cache/kernels/.lock"
if ! flock -n 9; then
    log "waiting for another build-kernels run (lock $cache/kernels/.lock)"
    flock 9
fi
# Downloads an interrupted run left behind.
rm -rf "$cache"/kernel-src/.dl.*

t_start=0
step_log=""
# run_step DESCRIPTION COMMAND...: run with all output to the build log, print the step and
# its wall time on stderr; on failure print one line naming the log and return 1.
run_step() {
    local what="$1"; shift
    local t0=$SECONDS rc=0 first
    echo "=== $(date -u +%FT%TZ) $what: $*" >> "$step_log"
    first=$(( $(wc -l < "$step_log") + 1 ))
    # A subshell outside any || so that set -e holds inside the step's functions.
    set +e
    ( set -e; "$@" ) >> "$step_log" 2>&1
    rc=$?
    set -e
    if [ "$rc" != 0 ]; then
        local hint
        hint="$(tail -n +"$first" "$step_log" \
                | grep -E '(error:|Error [0-9]|^E: |No such file|not found|^make.*\*\*\*)' \
                | head -n1 | cut -c1-160)"
        log "$cur: $what failed (exit $rc after $((SECONDS - t0)) s)${hint:+: $hint}; log: $step_log"
        return 1
    fi
    log "$cur: $what ($((SECONDS - t0)) s, $((SECONDS - t_start)) s in all)"
}

# Download and unpack a source package version once: $cache/kernel-src/<package>_<version>/
# holds the source tree (linux-source-X/) and .epoch (the tarball's mtime, used as the
# build timestamp).  The .deb and the tarball are deleted once unpacked.
fetch_source() {
    local suite="$1" package="$2" version="$3" dest="$4" tmp tarball
    tmp="$(mktemp -d "$cache/kernel-src/.dl.XXXXXX")"
    (cd "$tmp" && apt_for "$suite" apt-get download -q -o APT::Sandbox::User=root \
        "$package=$version")
    mkdir -p "$tmp/deb"
    dpkg-deb -x "$tmp"/*.deb "$tmp/deb"
    rm -f "$tmp"/*.deb
    tarball="$(ls "$tmp"/deb/usr/src/linux-source-*.tar.* | head -n1)"
    [ -n "$tarball" ] || { echo "no /usr/src/linux-source-*.tar.* in $package"; return 1; }
    mkdir -p "$tmp/src"
    tar -C "$tmp/src" -xf "$tarball"
    stat -c %Y "$tarball" > "$tmp/src/.epoch"
    rm -rf "$tmp/deb"
    rm -rf "$dest"
    mv "$tmp/src" "$dest"
    rmdir "$tmp"
}

# configure_tree SRC BDIR N MAKE-ARGV(N words)... FRAGMENT...: tinyconfig, then the
# fragments merged in order (merge_config.sh -m), then olddefconfig.
configure_tree() {
    local src="$1" bdir="$2" n="$3"; shift 3
    local mk=("${@:1:$n}") frags=("${@:$((n + 1))}")
    "${mk[@]}" tinyconfig
    (cd "$bdir" && "$src/scripts/kconfig/merge_config.sh" -m -O "$bdir" "$bdir/.config" "${frags[@]}")
    "${mk[@]}" olddefconfig
}

build_one() {
    local name="$1"
    local package="${K_PACKAGE[$name]}" suite="${K_SUITE[$name]}" alloc="${K_ALLOC[$name]}"
    local out="$cache/kernels/$name" version hash srcdir src bdir frags=() f epoch
    local image
    image="$(image_name "$name")"
    cur="$name"
    t_start=$SECONDS
    mkdir -p "$out"
    step_log="$out/build.log"

    version="$(source_version "$name")" || return 1
    hash="$(inputs_hash "$name" "$version")"
    if [ "$force" = 0 ] && [ -s "$out/$image" ] && [ -s "$out/build.json" ] \
            && [ -e "$out/build/Module.symvers" ] \
            && [ "$(json_field "$out/build.json" inputs_hash)" = "$hash" ]; then
        log "$name: up to date ($package $version, inputs ${hash:0:12}): $out/$image"
        return 0
    fi
    [ -e "$step_log" ] && mv -f "$step_log" "$step_log.old"
    {
        echo "build-kernels: $name from $package $version (Debian $suite), inputs $hash"
        inputs_manifest "$name" "$version"
    } > "$step_log"
    log "$name: $package $version (Debian $suite), $alloc, inputs ${hash:0:12}; log: $step_log"

    srcdir="$cache/kernel-src/${package}_${version}"
    if [ ! -e "$srcdir/.epoch" ]; then
        run_step "download and unpack $package $version" \
            fetch_source "$suite" "$package" "$version" "$srcdir" || return 1
    else
        log "$name: source $srcdir already unpacked"
    fi
    src="$(ls -d "$srcdir"/linux-source-* | head -n1)"
    epoch="$(cat "$srcdir/.epoch")"

    for f in ${K_FRAGS[$name]}; do frags+=("$configs/$f"); done
    bdir="$out/build"
    rm -rf "$bdir" "$out/$image" "$out/build.json"
    mkdir -p "$bdir"
    local mk=(make -C "$src" O="$bdir" ARCH="$(make_arch "$name")" LOCALVERSION=
              KBUILD_BUILD_TIMESTAMP="$(date -u -d "@$epoch" '+%a %b %e %T UTC %Y')"
              KBUILD_BUILD_USER=slabtune KBUILD_BUILD_HOST=slabtune KBUILD_BUILD_VERSION=1)
    run_step "configure: tinyconfig + ${K_FRAGS[$name]}" \
        configure_tree "$src" "$bdir" "${#mk[@]}" "${mk[@]}" "${frags[@]}" || return 1
    local verify
    if ! verify="$(verify_config "$bdir/.config" "${frags[@]}")"; then
        echo "$verify" >> "$step_log"
        echo "$verify" | grep '^MISSING' | sed "s/^/build-kernels: $name: /" >&2
        log "$name: configure failed: options above did not stick in $bdir/.config; log: $step_log"
        return 1
    fi
    echo "$verify" >> "$step_log"
    log "$name: config verified: $(echo "$verify" | tail -n1), every one in .config"

    run_step "compile: nice -n 19 make -j$jobs all ($image, modules, Module.symvers)" \
        nice -n 19 "${mk[@]}" -j"$jobs" all || return 1
    [ -s "$bdir/Module.symvers" ] || : > "$bdir/Module.symvers"

    local release bz_size config_hash built_at
    release="$("${mk[@]}" -s --no-print-directory kernelrelease 2>/dev/null)"
    config_hash="$(sha256sum < "$bdir/.config" | cut -c1-64)"
    cp "$bdir/$(image_in_tree "$name")" "$out/$image.tmp"
    mv "$out/$image.tmp" "$out/$image"
    cp "$bdir/.config" "$out/config"
    bz_size="$(stat -c %s "$out/$image")"
    built_at="$(date -u +%FT%TZ)"
    {
        echo "{"
        echo "  \"name\": $(json_str "$name"),"
        echo "  \"package\": $(json_str "$package"),"
        echo "  \"version\": $(json_str "$version"),"
        echo "  \"suite\": $(json_str "$suite"),"
        echo "  \"allocator\": $(json_str "$alloc"),"
        printf '  "fragments": ['
        local sep=""
        for f in ${K_FRAGS[$name]}; do printf '%s%s' "$sep" "$(json_str "$f")"; sep=", "; done
        echo "],"
        echo "  \"inputs_hash\": $(json_str "$hash"),"
        echo "  \"config_hash\": $(json_str "$config_hash"),"
        echo "  \"kernel_release\": $(json_str "$release"),"
        echo "  \"built_at\": $(json_str "$built_at"),"
        echo "  \"build_seconds\": $((SECONDS - t_start)),"
        echo "  \"jobs\": $jobs,"
        if [ "${K_ARCH[$name]}" = x86 ]; then
            echo "  \"bzimage\": $(json_str "$out/bzImage"),"
            echo "  \"bzimage_bytes\": $bz_size,"
        else
            echo "  \"arch\": $(json_str "${K_ARCH[$name]}"),"
            echo "  \"image\": $(json_str "$out/$image"),"
            echo "  \"image_bytes\": $bz_size,"
        fi
        echo "  \"build_dir\": $(json_str "$bdir"),"
        echo "  \"source_dir\": $(json_str "$src"),"
        echo "  \"log\": $(json_str "$step_log")"
        echo "}"
    } > "$out/build.json.tmp"
    mv "$out/build.json.tmp" "$out/build.json"
    log "$name: built $release: $out/$image ($((bz_size / 1024)) KiB) in $((SECONDS - t_start)) s"
}

# Unpacked sources no kernel's build.json names any more (an older version).
prune_sources() {
    local d used
    for d in "$cache"/kernel-src/*_*; do
        [ -d "$d" ] || continue
        used=0
        grep -qsF "\"source_dir\": \"$d/" "$cache"/kernels/*/build.json && used=1
        for n in "${selected[@]}"; do
            [ "$d" = "$cache/kernel-src/${K_PACKAGE[$n]}_${cur_versions[$n]:-}" ] && used=1
        done
        if [ "$used" = 0 ]; then
            log "removing unused source $d"
            rm -rf "$d"
        fi
    done
}

declare -A cur_versions
failed=()
for name in "${selected[@]}"; do
    if build_one "$name"; then
        cur_versions[$name]="$(json_field "$cache/kernels/$name/build.json" version)"
    else
        failed+=("$name")
    fi
done
[ ${#failed[@]} -eq 0 ] && prune_sources
if [ ${#failed[@]} -gt 0 ]; then
    log "failed: ${failed[*]}"
    exit 1
fi
