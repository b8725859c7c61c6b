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

if(RENAISSANCE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(RENAISSANCE_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()
