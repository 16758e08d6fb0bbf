#!/bin/sh
# build.sh OUT [SRC]: a static program without libc (gcc alone: make deps
# installs it), sbx-reaper by default. The Makefile and the agent's tests
# build sbx-reaper this way, and the Makefile runsc's /proc umounter
# (patch 18's umount.c) too. -fno-ident: no gcc banner in the binary, so
# it does not change with the host's gcc.
set -e
exec "${CC:-gcc}" -Os -static -nostdlib -ffreestanding -fno-stack-protector \
	-fno-pie -no-pie -fno-asynchronous-unwind-tables -fno-ident -Wall -Wextra -Werror \
	-s -o "$1" "${2:-$(dirname "$0")/reaper.c}"
