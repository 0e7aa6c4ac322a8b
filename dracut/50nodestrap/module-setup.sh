#!/bin/bash
# dracut module for nodestrap: bootstraps the node from the initramfs, after the real root is
# mounted at /sysroot (and after Ignition's files stage on a first boot), before switch-root.
# Laid out like Ignition's and afterburn's modules.
# moddir, systemdsystemunitdir, systemdutildir: dracut's, set before it sources this file.
# shellcheck disable=SC2154

# Only included on request (`--add nodestrap` or a distro module's depends()).
check() {
    return 255
}

depends() {
    echo systemd network
}

# Whether the ELF file $1 is built for architecture $2 (its e_machine).
nodestrap_for_arch() {
    local machine
    machine=$(od -An -tu2 -j18 -N2 "$1" 2>/dev/null | tr -d ' ')
    case "$2:$machine" in
        x86_64:62 | aarch64:183) return 0 ;;
    esac
    return 1
}

# The sysext payload mounts each image read-only through a loop device to check it as
# systemd-sysext will (squashfs, erofs); overlay for the merge the real root does later.
installkernel() {
    hostonly='' instmods loop squashfs erofs overlay
}

install() {
    # The binary for the initramfs' architecture: packaging puts nodestrap.<arch> (or one
    # nodestrap) into the module folder, as Ignition's packaging does; a host-installed one is
    # the fallback. A binary for another architecture is never taken.
    local arch=${DRACUT_ARCH:-$(uname -m)} bin found=
    for bin in "$moddir/nodestrap.$arch" "$moddir/nodestrap" "$(command -v nodestrap)"; do
        if [[ -f $bin ]] && nodestrap_for_arch "$bin" "$arch"; then
            found=$bin
            break
        fi
    done
    if [[ -z $found ]]; then
        derror "nodestrap: no nodestrap binary for $arch in $moddir or on PATH"
        exit 1
    fi
    inst_simple "$found" /usr/bin/nodestrap || exit 1
    # The release keyring that signs torcx manifests (the default --keyring).
    local keyring
    for keyring in "$moddir/keyring.asc" /usr/share/nodestrap/keyring.asc; do
        if [[ -f "$keyring" ]]; then
            inst_simple "$keyring" /usr/share/nodestrap/keyring.asc
            break
        fi
    done
    inst_multiple cat sed tr awk mv cp ln mkdir
    inst_script "$moddir/nodestrap-resolv" /usr/lib/nodestrap/nodestrap-resolv || exit 1
    inst_simple "$moddir/99-nodestrap-dhcp.network" /usr/lib/nodestrap/99-nodestrap-dhcp.network || exit 1
    inst_simple "$moddir/nodestrap-initrd.service" "$systemdsystemunitdir/nodestrap-initrd.service" || exit 1
    # The generator hooks the unit into initrd.target on the boots that need it; `|| exit 1`
    # so that a missing file fails the build instead of an initramfs that silently skips it.
    inst_script "$moddir/nodestrap-generator" "$systemdutildir/system-generators/nodestrap-generator" || exit 1
}
