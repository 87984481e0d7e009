# dlaunch: the two set-up commands of the README, and the container images.
VENV ?= .venv
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: demo check test

## demo: install the trainer and launcher, then run a short 2-process ResNet-50 DDP job on this machine
demo:
	scripts/bootstrap.sh run
	dlaunch run --site local --gpus 2 --model resnet50 --image-size 128 --data synthetic --batch-size 8 --steps 20 --warmup-steps 5

## check: lint, format and type checks over dlaunch/ (ruff and mypy, pinned in the test extras; pyproject.toml)
check:
	ruff check dlaunch
	ruff format --check dlaunch
	mypy

## test: install everything the tests need (Slurm, MPI, Horovod, DeepSpeed, DALI), run the checks, then the tests
test:
	scripts/bootstrap.sh full
	$(MAKE) check
	python -m pytest

include containers/images.mk
