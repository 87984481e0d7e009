# Container images (included by the top-level Makefile). Run from the repository root:
#   make image-ddp | image-horovod | image-deepspeed [STACK=paper|current|cpu|rocm]   one image
#   make image-tensorflow | image-mxnet STACK=cpu      the TensorFlow and MXNet trainers (cpu stack only)
#   make images [STACK=...]                                                           all of the stack's
# (one image per image group of the framework table, dlaunch/train/framework_table.py's image_groups(), in the
# stacks that have its containers/<stack>/<group>.def)
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
IMAGE_FRAMEWORKS := $(shell python3 -c 'import dlaunch.train.framework_table as t; print(*t.image_groups())')
IMAGE_TARGETS := $(addprefix image-,$(IMAGE_FRAMEWORKS))
ROOTFS_TARGETS := $(addprefix rootfs-,$(IMAGE_FRAMEWORKS))
IMAGE_STACKS := $(sort $(notdir $(patsubst %/,%,$(dir $(wildcard containers/*/*.def)))))
CHECK_STACK = @$(if $(and $(filter 1,$(words $(STACK))),$(filter $(STACK),$(IMAGE_STACKS))),true,echo "make $@: unknown STACK (one of: $(IMAGE_STACKS))" >&2; exit 2)
# The stack's images (TensorFlow's and MXNet's only where the lock pins them); a group it lacks is refused.
STACK_FRAMEWORKS = $(foreach group,$(IMAGE_FRAMEWORKS),$(if $(wildcard containers/$(STACK)/$(group).def),$(group)))
CHECK_GROUP = @$(if $(wildcard containers/$(STACK)/$*.def),true,echo "make $@: stack $(STACK) has no $* image (stacks with one: $(patsubst containers/%/$*.def,%,$(wildcard containers/*/$*.def)))" >&2; exit 2)

.PHONY: images $(IMAGE_TARGETS) $(ROOTFS_TARGETS)

## images: build every image of STACK (default: current): $(STACK_FRAMEWORKS)
images: $(addprefix image-,$(STACK_FRAMEWORKS))

## image-<framework>: build images/$(STACK)-<framework>-<arch>.sif (needs apptainer or singularity)
$(IMAGE_TARGETS): image-%:
	@$(if $(APPTAINER),true,echo "make $@: neither apptainer nor singularity is on PATH; install Apptainer >= 1.2 (or load the site module) to build images" >&2; exit 1)
	$(CHECK_STACK)
	$(CHECK_GROUP)
	mkdir -p "$(IMAGES_DIR)"
	"$(APPTAINER)" build $(APPTAINER_BUILD_FLAGS) --build-arg "GIT_REVISION=$(GIT_REVISION)" "$(IMAGES_DIR)/$(STACK)-$*-$(ARCH).sif" "containers/$(STACK)/$*.def"

## rootfs-<framework>: build a debootstrap STACK (cpu) without Apptainer into images/$(STACK)-<framework>-<arch> (root, mmdebstrap)
$(ROOTFS_TARGETS): rootfs-%:
	$(CHECK_STACK)
	$(CHECK_GROUP)
	"$(ROOTFS_PYTHON)" scripts/build-rootfs.py --build-arg "GIT_REVISION=$(GIT_REVISION)" --output "$(IMAGES_DIR)/$(STACK)-$*-$(ARCH)" "containers/$(STACK)/$*.def"
