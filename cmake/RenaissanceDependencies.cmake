# Third-party dependencies. Everything comes from the system (Debian packages, Spack, or the
# GPU machine's Ubuntu): find_package first, plain library search where a package ships no
# CMake config (XNNPACK).
find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(ZLIB REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 CONFIG REQUIRED)

# yaml-cpp 0.7 exports `yaml-cpp`, 0.8 `yaml-cpp::yaml-cpp`.
if(TARGET yaml-cpp::yaml-cpp)
  set(RENAISSANCE_YAML_TARGET yaml-cpp::yaml-cpp)
else()
  set(RENAISSANCE_YAML_TARGET yaml-cpp)
endif()

# HDF5 as an imported target regardless of CMake version.
if(NOT TARGET renaissance_hdf5)
  add_library(renaissance_hdf5 INTERFACE)
  target_include_directories(renaissance_hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS} ${HDF5_INCLUDE_DIRS})
  target_link_libraries(renaissance_hdf5 INTERFACE ${HDF5_C_LIBRARIES})
  target_compile_definitions(renaissance_hdf5 INTERFACE ${HDF5_C_DEFINITIONS} ${HDF5_DEFINITIONS})
endif()

# XNNPACK (Debian ships a header and a .so, no CMake config and no .pc file).
set(RENAISSANCE_HAVE_XNNPACK OFF)
if(NOT RENAISSANCE_XNNPACK STREQUAL "OFF")
  find_path(XNNPACK_INCLUDE_DIR xnnpack.h)
  find_library(XNNPACK_LIBRARY XNNPACK)
  find_path(PTHREADPOOL_INCLUDE_DIR pthreadpool.h)
  find_library(PTHREADPOOL_LIBRARY pthreadpool)
  if(XNNPACK_INCLUDE_DIR AND XNNPACK_LIBRARY AND PTHREADPOOL_INCLUDE_DIR)
    set(RENAISSANCE_HAVE_XNNPACK ON)
    add_library(renaissance_xnnpack INTERFACE)
    target_include_directories(renaissance_xnnpack SYSTEM INTERFACE ${XNNPACK_INCLUDE_DIR} ${PTHREADPOOL_INCLUDE_DIR})
    target_link_libraries(renaissance_xnnpack INTERFACE ${XNNPACK_LIBRARY})
    if(PTHREADPOOL_LIBRARY)
      target_link_libraries(renaissance_xnnpack INTERFACE ${PTHREADPOOL_LIBRARY})
    endif()
  elseif(RENAISSANCE_XNNPACK STREQUAL "ON")
    message(FATAL_ERROR "RENAISSANCE_XNNPACK=ON but xnnpack.h / libXNNPACK / pthreadpool.h were not found")
  endif()
endif()

# Image codecs (issue 12): libjpeg-turbo's TurboJPEG API (decode and encode JPEG) and libpng (decode PNG). Both are
# optional: without them `data import folder` refuses the files it cannot read and a JPEG store cannot be read, each
# naming the missing package. Plain searches: Debian's libturbojpeg0-dev ships a CMake config, Ubuntu's and Spack's
# layouts differ, and the header and library are all that is needed.
set(RENAISSANCE_HAVE_TURBOJPEG OFF)
if(NOT RENAISSANCE_JPEG STREQUAL "OFF")
  find_path(TURBOJPEG_INCLUDE_DIR turbojpeg.h)
  find_library(TURBOJPEG_LIBRARY NAMES turbojpeg libturbojpeg.so.0)
  if(TURBOJPEG_INCLUDE_DIR AND TURBOJPEG_LIBRARY)
    set(RENAISSANCE_HAVE_TURBOJPEG ON)
    add_library(renaissance_turbojpeg INTERFACE)
    target_include_directories(renaissance_turbojpeg SYSTEM INTERFACE ${TURBOJPEG_INCLUDE_DIR})
    target_link_libraries(renaissance_turbojpeg INTERFACE ${TURBOJPEG_LIBRARY})
    # The same library's libjpeg API, for partial decoding (jpeg_skip_scanlines / jpeg_crop_scanline: a random-resized
    # crop decodes only its box, io/image.h decode_image_region). Optional: without it the whole image is decoded.
    # libjpeg-turbo >= 2.0 only (the partial decoder's fixes for fancy upsampling); Debian: libjpeg62-turbo-dev.
    find_path(LIBJPEG_TURBO_INCLUDE_DIR jpeglib.h)
    find_library(LIBJPEG_TURBO_LIBRARY NAMES jpeg libjpeg.so.62 libjpeg.so.8)
    set(RENAISSANCE_HAVE_JPEG_REGION OFF)
    if(LIBJPEG_TURBO_INCLUDE_DIR AND LIBJPEG_TURBO_LIBRARY)
      include(CheckCSourceCompiles)
      set(CMAKE_REQUIRED_INCLUDES ${LIBJPEG_TURBO_INCLUDE_DIR})
      set(CMAKE_REQUIRED_LIBRARIES ${LIBJPEG_TURBO_LIBRARY})
      check_c_source_compiles([[
#include <stdio.h>
#include <jpeglib.h>
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 2000000
#error "not libjpeg-turbo >= 2.0"
#endif
int main(void) {
  struct jpeg_decompress_struct c;
  JDIMENSION x = 0, w = 0;
  jpeg_crop_scanline(&c, &x, &w);
  return (int)jpeg_skip_scanlines(&c, 0);
}]] RENAISSANCE_LIBJPEG_TURBO_PARTIAL)
      unset(CMAKE_REQUIRED_INCLUDES)
      unset(CMAKE_REQUIRED_LIBRARIES)
      if(RENAISSANCE_LIBJPEG_TURBO_PARTIAL)
        set(RENAISSANCE_HAVE_JPEG_REGION ON)
        target_include_directories(renaissance_turbojpeg SYSTEM INTERFACE ${LIBJPEG_TURBO_INCLUDE_DIR})
        target_link_libraries(renaissance_turbojpeg INTERFACE ${LIBJPEG_TURBO_LIBRARY})
        target_compile_definitions(renaissance_turbojpeg INTERFACE RENAISSANCE_HAVE_JPEG_REGION=1)
      endif()
    endif()
    message(STATUS "Renaissance: JPEG partial decoding (libjpeg-turbo's libjpeg API) ${RENAISSANCE_HAVE_JPEG_REGION}")
  elseif(RENAISSANCE_JPEG STREQUAL "ON")
    message(FATAL_ERROR "RENAISSANCE_JPEG=ON but turbojpeg.h / libturbojpeg were not found (apt-get install libturbojpeg0-dev)")
  else()
    message(STATUS "Renaissance: libturbojpeg not found: no JPEG import or JPEG stores on the CPU (apt-get install libturbojpeg0-dev)")
  endif()
endif()
set(RENAISSANCE_HAVE_LIBPNG OFF)
if(NOT RENAISSANCE_PNG STREQUAL "OFF")
  find_package(PNG QUIET)
  if(PNG_FOUND)
    set(RENAISSANCE_HAVE_LIBPNG ON)
    # Paths, not the imported PNG::PNG: the installed config then needs no find_dependency(PNG).
    add_library(renaissance_png INTERFACE)
    target_include_directories(renaissance_png SYSTEM INTERFACE ${PNG_INCLUDE_DIRS})
    target_link_libraries(renaissance_png INTERFACE ${PNG_LIBRARIES})
    target_compile_definitions(renaissance_png INTERFACE ${PNG_DEFINITIONS})
  elseif(RENAISSANCE_PNG STREQUAL "ON")
    message(FATAL_ERROR "RENAISSANCE_PNG=ON but libpng was not found (apt-get install libpng-dev)")
  else()
    message(STATUS "Renaissance: libpng not found: no PNG import (apt-get install libpng-dev)")
  endif()
endif()

if(RENAISSANCE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(RENAISSANCE_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()
