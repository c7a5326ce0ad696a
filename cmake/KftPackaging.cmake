# SPDX-License-Identifier: Apache-2.0
# CPack for kft: `cpack -G DEB` (or `-G TGZ`) in a build directory packages what `cmake --install`
# installs: the headers with this build's kft/configured.hpp, the CMake package, kft.pc, the tools
# that were built, the templates, LICENSE and NOTICE. The package's Depends are the tools' shared
# libraries (found by dpkg-shlibdeps); the components' libraries (MPI, hwloc, Gloo, CUDA) are only
# needed by a consumer that asks for the component, so they are suggestions.
set(KFT_PACKAGE_MAINTAINER "The kft authors <maintainers@kft.invalid>" CACHE STRING
    "Maintainer field of the packages CPack makes (set it when you distribute them)")
set(CPACK_PACKAGE_NAME "kft")
set(CPACK_PACKAGE_VENDOR "The kft authors")
set(CPACK_PACKAGE_CONTACT "${KFT_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_RESOURCE_FILE_LICENSE "${PROJECT_SOURCE_DIR}/LICENSE")
set(CPACK_PACKAGE_INSTALL_DIRECTORY "kft")
set(CPACK_GENERATOR "DEB;TGZ")
# A .deb installs into /usr whatever CMAKE_INSTALL_PREFIX the build was configured with.
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${KFT_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION "devel")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
  "${PROJECT_DESCRIPTION}\n kft is like torchrun + torch.distributed + DDP for C++ programs: it discovers\n the job (torchrun, mpirun, Slurm, Kubernetes), meets the other ranks and gives a\n process group (shared memory, MPI, Gloo, NCCL). This package holds the headers, the\n CMake package (find_package(kft)), kft.pc and the tools kftrun, kft-info and\n kft-manifest.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # kft_<version>_<arch>.deb
# dpkg-shlibdeps turns the tools' shared libraries (libc, libstdc++, yaml-cpp, MPI and hwloc for
# kft-info...) into Depends; a library no package owns (a CUDA toolkit under /usr/local) is left
# out. Without dpkg-shlibdeps the package names the C++ runtime only.
find_program(KFT_DPKG_SHLIBDEPS dpkg-shlibdeps)
mark_as_advanced(KFT_DPKG_SHLIBDEPS)
if(KFT_DPKG_SHLIBDEPS)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
else()
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6, libstdc++6")
endif()
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "cmake (>= 3.25), pkg-config, g++ (>= 12), libopenmpi-dev, libhwloc-dev, libgloo-dev")
include(CPack)
