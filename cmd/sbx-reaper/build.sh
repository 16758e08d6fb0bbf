#!/bin/sh
# build.sh OUT: sbx-reaper, static and without libc (gcc alone: make deps
# installs it). The Makefile and the agent's tests build it this way.
set -e
exec "${CC:-gcc}" -Os -static -nostdlib -ffreestanding -fno-stack-protector \
	-fno-pie -no-pie -fno-asynchronous-unwind-tables -Wall -Wextra -Werror \
	-s -o "$1" "$(dirname "$0")/reaper.c"
