# Container images (included by the top-level Makefile). Run from the repository root:
#   make image-ddp | image-horovod | image-deepspeed [STACK=paper|current]   one image
#   make images [STACK=...]                                                  all three
# Output: $(IMAGES_DIR)/<stack>-<framework>.sif, from containers/<stack>/<framework>.def
# (generated from containers/versions.toml by `dlaunch images --render`).
# Building needs root, --fakeroot (default flags below) or a remote builder:
#   make image-ddp APPTAINER_BUILD_FLAGS=--remote
STACK ?= current
IMAGES_DIR ?= $(or $(DLAUNCH_IMAGES_DIR),images)
APPTAINER ?= $(shell command -v apptainer || command -v singularity)
APPTAINER_BUILD_FLAGS ?= --fakeroot
GIT_REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
IMAGE_FRAMEWORKS := $(shell python3 -c "import train.framework_table as t; print(*t.image_frameworks())")
IMAGE_TARGETS := $(addprefix image-,$(IMAGE_FRAMEWORKS))
IMAGE_STACKS := $(sort $(notdir $(patsubst %/,%,$(dir $(wildcard containers/*/*.def)))))

.PHONY: images $(IMAGE_TARGETS)

## images: build the ddp, horovod and deepspeed images of STACK (default: current)
images: $(IMAGE_TARGETS)

## image-<framework>: build images/$(STACK)-<framework>.sif (needs apptainer or singularity)
$(IMAGE_TARGETS): image-%:
	@$(if $(APPTAINER),true,echo "make $@: neither apptainer nor singularity is on PATH; install Apptainer >= 1.2 (or load the site module) to build images" >&2; exit 1)
	@$(if $(and $(filter 1,$(words $(STACK))),$(filter $(STACK),$(IMAGE_STACKS))),true,echo "make $@: unknown STACK (one of: $(IMAGE_STACKS))" >&2; exit 2)
	mkdir -p "$(IMAGES_DIR)"
	"$(APPTAINER)" build $(APPTAINER_BUILD_FLAGS) --build-arg "GIT_REVISION=$(GIT_REVISION)" "$(IMAGES_DIR)/$(STACK)-$*.sif" "containers/$(STACK)/$*.def"
