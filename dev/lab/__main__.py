"""``python -m dev.lab up|down|ssh|status|image`` from the checkout (scripts/main.sh, molecule/lab)."""

from __future__ import annotations

import argparse
import sys

from . import debpkg, image
from .boot import down, up
from .common import BOOT_TIMEOUT, DEFAULT_PORT, PORT_ENV, RUN_TOOLS, LabError, default_port, ensure_tools, lab_dir
from .status import ssh, status


def cmd_lab(args: argparse.Namespace) -> int:
    lab = lab_dir()
    try:
        if args.lab_command == "up":
            return up(lab, args.port, args.fresh, args.rebuild, args.timeout, args.loader, args.one_node)
        if args.lab_command == "down":
            return down(lab, args.force, args.timeout)
        if args.lab_command == "status":
            return status(lab, args.json)
        if args.lab_command == "image":
            ensure_tools(RUN_TOOLS)
            for loader in args.loader or [image.DEFAULT_LOADER]:
                print(image.ensure_image(lab, args.rebuild, loader))
            return 0
        return ssh(lab, args.cmd)
    except LabError as exc:
        print(f"dev.lab: error: {exc}", file=sys.stderr)
        return 2
    except debpkg.CommandError as exc:
        print(f"dev.lab: {exc}", file=sys.stderr)
        return 1


def parser() -> argparse.ArgumentParser:
    """``python -m dev.lab`` and its subcommands."""
    p = argparse.ArgumentParser(
        prog="python -m dev.lab",
        description="Build (cached) and run the lab host: Debian 12 on q35 with an emulated Intel IOMMU and "
        "QEMU edu devices standing in for GPUs, booting through OVMF and its own GRUB. State and images under "
        "${GPUPROV_CACHE:-~/.cache/gpuprov}/lab/. inventories/lab targets it.",
    )
    lab_sub = p.add_subparsers(
        dest="lab_command", metavar="ACTION", required=True, help="up, down, ssh, status or image"
    )
    q = lab_sub.add_parser("up", help="build the image if needed, boot the lab host, wait for SSH")
    q.add_argument(
        "--port",
        type=int,
        default=default_port(),
        help=f"SSH port on 127.0.0.1 (default ${PORT_ENV} or {DEFAULT_PORT})",
    )
    q.add_argument("--fresh", action="store_true", help="start from the pristine image (drop the lab host's changes)")
    q.add_argument("--rebuild", action="store_true", help="rebuild the image even if it is cached")
    q.add_argument("--timeout", type=float, default=BOOT_TIMEOUT, help="seconds to wait for SSH")
    q.add_argument(
        "--one-node",
        action="store_true",
        help="one NUMA node, 2 vCPUs, 2 GiB and no large-BAR devices (molecule/lab_boot; inventories/lab's "
        "lab-multi needs the default two nodes)",
    )
    q.add_argument(
        "--loader",
        choices=image.LOADERS,
        default=image.DEFAULT_LOADER,
        help="the boot loader of the lab host's image: GRUB (default) or systemd-boot on a GPT ESP at "
        f"{image.ESP_MOUNT} (each has its own cached image; switching starts the lab host fresh)",
    )
    q = lab_sub.add_parser("down", help="power the lab host off (its disk is kept; up --fresh drops it)")
    q.add_argument("--force", action="store_true", help="stop QEMU at once instead of a clean poweroff")
    q.add_argument("--timeout", type=float, default=120, help="seconds to wait for a clean poweroff")
    q = lab_sub.add_parser("ssh", help="run a command on the lab host as root (a shell without one)")
    q.add_argument("cmd", nargs=argparse.REMAINDER, help="the command and its arguments")
    q = lab_sub.add_parser(
        "image",
        help="install the lab's tools and build its image if it is not cached (no boot); print its folder",
    )
    q.add_argument(
        "--loader",
        action="append",
        choices=image.LOADERS,
        help=f"the image of this boot loader (default {image.DEFAULT_LOADER}; give it twice for both)",
    )
    q.add_argument("--rebuild", action="store_true", help="rebuild the image even if it is cached")
    q = lab_sub.add_parser("status", help="whether it runs, its SSH port, the image's cache key")
    q.add_argument("--json", action="store_true", help="as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    return cmd_lab(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
