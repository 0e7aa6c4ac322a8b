#!/bin/bash
# dracut module for nodestrap: bootstraps the node from the initramfs, after the real root is
# mounted at /sysroot (and after Ignition's files stage on a first boot), before switch-root.
# Laid out like Ignition's and afterburn's modules.

# Only included on request (`--add nodestrap` or a distro module's depends()).
check() {
    return 255
}

depends() {
    echo systemd network
}

install() {
    # Packaging puts the static binary into the module folder, as Ignition's packaging does;
    # a host-installed one is the fallback.
    if [[ -x "$moddir/nodestrap" ]]; then
        inst_simple "$moddir/nodestrap" /usr/bin/nodestrap || exit 1
    else
        inst_binary nodestrap /usr/bin/nodestrap || exit 1
    fi
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
