# dlaunch: the two set-up commands of the README, and the container images.
VENV ?= .venv
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: demo test

## demo: install the trainer and launcher, then run a short 2-process ResNet-50 DDP job on this machine
demo:
	scripts/bootstrap.sh run
	dlaunch run --site local --gpus 2 --model resnet50 --image-size 128 --data synthetic --batch-size 8 --steps 20 --warmup-steps 5

## test: install everything the tests need (Slurm, MPI, Horovod, DeepSpeed, DALI) and run them
test:
	scripts/bootstrap.sh full
	python -m pytest

include containers/images.mk
