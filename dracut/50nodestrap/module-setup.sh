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
    # A static musl binary resolves names only from /etc/hosts and /etc/resolv.conf; the
    # network stack in the initramfs provides the latter if it does DNS at all (IP addresses
    # always work).
    inst_multiple -o /etc/hosts
    # DHCP on every wired link unless ip= or a host configuration says otherwise (those sort
    # first): the bootstrap needs the network even when Ignition did not.
    inst_simple "$moddir/99-nodestrap-dhcp.network" /usr/lib/systemd/network/99-nodestrap-dhcp.network
    inst_simple "$moddir/nodestrap-initrd.service" "$systemdsystemunitdir/nodestrap-initrd.service"
    # `|| exit 1`: a missing unit fails the build instead of an initramfs that silently skips it.
    $SYSTEMCTL -q --root="$initdir" add-wants initrd.target nodestrap-initrd.service || exit 1
}
