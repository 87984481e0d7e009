"""Sites and their machines: `sites`, `images`, `render_images`, `doctor`."""

from pathlib import Path
from typing import List, Optional

from dlaunch.api.calls import api_function
from dlaunch.api.records import Check, Doctor, ImageInfo, SiteInfo
from dlaunch.errors import DlaunchError


@api_function
def sites() -> List[SiteInfo]:
    """The site profiles found (dlaunch/jobs/sites.py's folders), by name; an unreadable one says why."""
    from dlaunch.jobs.sites import available_sites, load_site

    found = []
    for name, path in available_sites().items():
        try:
            site = load_site(path)
        except DlaunchError as e:
            found.append(SiteInfo(name, str(path), unreadable=str(e)))
            continue
        found.append(
            SiteInfo(
                site.name,
                str(path),
                list(site.aliases),
                site.scheduler.kind,
                site.gpus_per_node,
                site.container.kind,
                site.description,
            )
        )
    return found


@api_function
def images(site: Optional[str] = None) -> List[ImageInfo]:
    """The container images per stack, framework image and architecture (those `site` uses, when given),
    the sites using each, whether it is built and its pins (a built image's labels, else the lock's)."""
    from dlaunch.jobs import images as lock_images
    from dlaunch.jobs.imagepaths import default_image, image_reference, stack_of
    from dlaunch.jobs.sites import resolve_site
    from dlaunch.train.framework_table import image_groups

    lock = lock_images.load_lock()
    if site is None:
        users = lock_images.site_stacks()
        shown = [(name, arch) for name, stack in lock.stacks.items() for arch in stack.architectures]
    else:
        chosen = resolve_site(site)
        stack_name = stack_of(chosen)
        if stack_name is None:
            raise DlaunchError("--site: site %s runs without a container" % chosen.name)
        users = {chosen.name: (stack_name, chosen.arch)}
        shown = [(stack_name, chosen.arch)]
    binary = lock_images.container_binary()
    found = []
    for stack_name, arch in shown:
        using = [name for name, used in users.items() if used == (stack_name, arch)]
        stack = lock.stacks.get(stack_name)
        for group in stack.image_groups() if stack else image_groups():
            sif = default_image(group, stack_name, arch)
            rootfs = Path(image_reference(group, stack_name, arch, "dir"))
            pins, source = lock_images.pins_of(sif, rootfs, stack, group, binary)
            built = [kind for kind, there in (("sif", sif.is_file()), ("root fs", rootfs.is_dir())) if there]
            found.append(ImageInfo(sif.stem, str(sif), using, built, source, dict(pins)))
    return found


@api_function
def render_images() -> List[str]:
    """Write containers/<stack>/<image>.def anew from the lock (containers/versions.toml); the files written."""
    from dlaunch.atomic import write_atomic
    from dlaunch.jobs.images import load_lock, render_all

    written = []
    for path, text in render_all(load_lock()).items():
        write_atomic(path, text)
        written.append(str(path))
    return written


@api_function
def doctor(
    site: str,
    *,
    partition: Optional[str] = None,
    account: Optional[str] = None,
    image: Optional[str] = None,
    framework: str = "ddp",
) -> Doctor:
    """Check a site before submitting (dlaunch/preflight.py): on a login node the scheduler, account, MPI,
    modules, runtime and image; inside an allocation also the node's architecture, rendezvous, interfaces,
    GPUs, driver and one all-reduce across the nodes. Failed checks are results, not errors."""
    import socket

    from dlaunch.preflight import examine

    profile, node, done = examine(site, partition, account, image, framework)
    return Doctor(
        profile.name, socket.gethostname(), node.on_node, [Check(c.name, c.result, c.found, c.fix) for c in done]
    )
