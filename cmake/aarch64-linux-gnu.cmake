# Cross-compiling for 64-bit Arm Linux with Debian's gcc-aarch64-linux-gnu (apt-get install gcc-aarch64-linux-gnu).
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# aarch64 builds have the scalar, neon and dotprod kernel levels (CMakeLists.txt, PI_LEVELS). The binaries run on an
# x86 host under qemu-user: QEMU_LD_PREFIX=/usr/aarch64-linux-gnu qemu-aarch64 -cpu max <program> (max: dotprod).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(PI_CROSS_TRIPLE aarch64-linux-gnu CACHE STRING "target triple of the cross toolchain")
set(CMAKE_C_COMPILER ${PI_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${PI_CROSS_TRIPLE}-g++)

# Libraries and headers come from the target sysroot (Debian: /usr/aarch64-linux-gnu), programs from the host.
set(CMAKE_FIND_ROOT_PATH /usr/${PI_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# try_run and tests run the target's programs through qemu-user when it is installed.
find_program(PI_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(PI_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${PI_QEMU_AARCH64} -L /usr/${PI_CROSS_TRIPLE})
endif()
