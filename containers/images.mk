# Container images (included by the top-level Makefile). Run from the repository root:
#   make image-ddp | image-horovod | image-deepspeed [STACK=paper|current|cpu|rocm]   one image
#   make images [STACK=...]                                                           all of them
# (one image per image group of the framework table, train/framework_table.py's image_groups())
#   make rootfs-ddp STACK=cpu     without Apptainer: a debootstrap recipe into an unpacked root file
#                                 system (Charliecloud's image format), scripts/build-rootfs.py
# Output: $(IMAGES_DIR)/<stack>-<framework>-<arch>.sif (rootfs-*: the same name without .sif, a link to
# the cached build in ~/.cache/dlaunch/rootfs), from containers/<stack>/<framework>.def (generated from
# containers/versions.toml by `dlaunch images --render`).
# Building needs root, --fakeroot (default flags below) or a remote builder:
#   make image-ddp APPTAINER_BUILD_FLAGS=--remote
STACK ?= current
ARCH ?= $(shell uname -m)
IMAGES_DIR ?= $(or $(DLAUNCH_IMAGES_DIR),images)
APPTAINER ?= $(shell command -v apptainer || command -v singularity)
APPTAINER_BUILD_FLAGS ?= --fakeroot
ROOTFS_PYTHON ?= $(or $(wildcard .venv/bin/python),python3)
# The commit, "-dirty" with uncommitted changes; "unknown" outside a git checkout (e.g. a source archive).
GIT_REVISION ?= $(shell rev=$$(git rev-parse --verify -q HEAD 2>/dev/null) && { git diff --quiet HEAD 2>/dev/null && echo "$$rev" || echo "$$rev-dirty"; } || echo unknown)
IMAGE_FRAMEWORKS := $(shell python3 -c 'import train.framework_table as t; print(*t.image_groups())')
IMAGE_TARGETS := $(addprefix image-,$(IMAGE_FRAMEWORKS))
ROOTFS_TARGETS := $(addprefix rootfs-,$(IMAGE_FRAMEWORKS))
IMAGE_STACKS := $(sort $(notdir $(patsubst %/,%,$(dir $(wildcard containers/*/*.def)))))
CHECK_STACK = @$(if $(and $(filter 1,$(words $(STACK))),$(filter $(STACK),$(IMAGE_STACKS))),true,echo "make $@: unknown STACK (one of: $(IMAGE_STACKS))" >&2; exit 2)

.PHONY: images $(IMAGE_TARGETS) $(ROOTFS_TARGETS)

## images: build every image of STACK (default: current): $(IMAGE_FRAMEWORKS)
images: $(IMAGE_TARGETS)

## image-<framework>: build images/$(STACK)-<framework>-<arch>.sif (needs apptainer or singularity)
$(IMAGE_TARGETS): image-%:
	@$(if $(APPTAINER),true,echo "make $@: neither apptainer nor singularity is on PATH; install Apptainer >= 1.2 (or load the site module) to build images" >&2; exit 1)
	$(CHECK_STACK)
	mkdir -p "$(IMAGES_DIR)"
	"$(APPTAINER)" build $(APPTAINER_BUILD_FLAGS) --build-arg "GIT_REVISION=$(GIT_REVISION)" "$(IMAGES_DIR)/$(STACK)-$*-$(ARCH).sif" "containers/$(STACK)/$*.def"

## rootfs-<framework>: build a debootstrap STACK (cpu) without Apptainer into images/$(STACK)-<framework>-<arch> (root, mmdebstrap)
$(ROOTFS_TARGETS): rootfs-%:
	$(CHECK_STACK)
	"$(ROOTFS_PYTHON)" scripts/build-rootfs.py --build-arg "GIT_REVISION=$(GIT_REVISION)" --output "$(IMAGES_DIR)/$(STACK)-$*-$(ARCH)" "containers/$(STACK)/$*.def"
