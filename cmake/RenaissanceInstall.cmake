# Install rules and the CMake package config (find_package(Renaissance)).
#
#   <prefix>/bin/renaissance
#   <prefix>/include/renaissance/**.h, include/kernels/cpu/*.h, include/kernels/cuda/*.h
#   <prefix>/lib/librenaissance*.a
#   <prefix>/lib/cmake/Renaissance/{RenaissanceConfig,RenaissanceConfigVersion,RenaissanceTargets}.cmake
#
# Consumers: find_package(Renaissance REQUIRED) + target_link_libraries(app PRIVATE Renaissance::renaissance).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(RENAISSANCE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/Renaissance"
    CACHE STRING "Where RenaissanceConfig.cmake is installed (relative to the prefix)")
mark_as_advanced(RENAISSANCE_INSTALL_CMAKEDIR)

# ---- the exported targets ----------------------------------------------------------------------
set(_rn_export_targets renaissance_core renaissance_kernels_cpu renaissance)
if(RENAISSANCE_HAVE_CUDA)
  list(APPEND _rn_export_targets renaissance_kernels_cuda)
endif()

# Static libraries carry their private link dependencies as $<LINK_ONLY:...>, so every
# project target they link (renaissance_warnings, renaissance_hdf5, renaissance_xnnpack, and
# whatever helper is added later) must be in the export set too. Collect them by walking
# INTERFACE_LINK_LIBRARIES instead of listing them, so a new helper target does not break
# install(EXPORT) at generate time.
function(_rn_collect_link_targets out)
  set(pending ${ARGN})
  set(seen "")
  while(pending)
    list(POP_FRONT pending tgt)
    if(NOT TARGET "${tgt}")
      continue()
    endif()
    get_target_property(aliased "${tgt}" ALIASED_TARGET)
    if(aliased)
      set(tgt "${aliased}")
    endif()
    get_target_property(imported "${tgt}" IMPORTED)
    if(imported OR tgt IN_LIST seen)
      continue()
    endif()
    list(APPEND seen "${tgt}")
    get_target_property(deps "${tgt}" INTERFACE_LINK_LIBRARIES)
    if(NOT deps)
      continue()
    endif()
    foreach(dep IN LISTS deps)
      # $<LINK_ONLY:x> → x; $<BUILD_INTERFACE:...> is not exported; other genexes are skipped.
      if(dep MATCHES "^\\$<LINK_ONLY:([^$<>]+)>$")
        set(dep "${CMAKE_MATCH_1}")
      elseif(dep MATCHES "^\\$<")
        continue()
      endif()
      if(TARGET "${dep}")
        list(APPEND pending "${dep}")
      endif()
    endforeach()
  endwhile()
  set(${out} "${seen}" PARENT_SCOPE)
endfunction()
_rn_collect_link_targets(_rn_export_targets ${_rn_export_targets})

# renaissance_hdf5 holds the build machine's absolute HDF5 paths; an installed package
# re-finds HDF5 (RenaissanceConfig.cmake) and links its HDF5::HDF5 target instead.
if(TARGET renaissance_hdf5 AND "renaissance_hdf5" IN_LIST _rn_export_targets)
  foreach(_prop INTERFACE_INCLUDE_DIRECTORIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES INTERFACE_LINK_LIBRARIES
                INTERFACE_COMPILE_DEFINITIONS)
    get_target_property(_vals renaissance_hdf5 ${_prop})
    if(NOT _vals)
      continue()
    endif()
    set(_wrapped "")
    foreach(_v IN LISTS _vals)
      if(NOT _v MATCHES "^\\$<(BUILD|INSTALL)_INTERFACE:")
        set(_v "$<BUILD_INTERFACE:${_v}>")
      endif()
      list(APPEND _wrapped "${_v}")
    endforeach()
    if(_prop STREQUAL "INTERFACE_LINK_LIBRARIES")
      list(APPEND _wrapped "$<INSTALL_INTERFACE:HDF5::HDF5>")
      list(REMOVE_DUPLICATES _wrapped)
    endif()
    set_property(TARGET renaissance_hdf5 PROPERTY ${_prop} "${_wrapped}")
  endforeach()
endif()

# Exported names drop the "renaissance_" prefix, like the build tree's aliases:
# Renaissance::renaissance, Renaissance::core, Renaissance::kernels_cpu, Renaissance::kernels_cuda
# (and the helpers Renaissance::warnings, Renaissance::hdf5, Renaissance::xnnpack).
foreach(_tgt IN LISTS _rn_export_targets)
  get_target_property(_export_name ${_tgt} EXPORT_NAME)
  if(NOT _export_name AND _tgt MATCHES "^renaissance_(.+)$")
    set_property(TARGET ${_tgt} PROPERTY EXPORT_NAME "${CMAKE_MATCH_1}")
  endif()
endforeach()

install(TARGETS ${_rn_export_targets}
  EXPORT RenaissanceTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# nvJPEG from outside the toolkit (.deps/nvjpeg, NVJPEG_ROOT) is on no loader path: the installed CLI finds it by RUNPATH.
if(RENAISSANCE_HAVE_NVJPEG)
  get_filename_component(_rn_nvjpeg_dir "${RENAISSANCE_NVJPEG_LIBRARY}" DIRECTORY)
  if(NOT _rn_nvjpeg_dir IN_LIST CUDAToolkit_LIBRARY_DIR)
    set_property(TARGET renaissance_cli APPEND PROPERTY INSTALL_RPATH "${_rn_nvjpeg_dir}")
  endif()
endif()
install(TARGETS renaissance_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# ---- headers: include/renaissance/..., include/kernels/{cpu,cuda} -------------------------------
install(DIRECTORY ${PROJECT_SOURCE_DIR}/lib/renaissance/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/renaissance
  FILES_MATCHING PATTERN "*.h"
  PATTERN "trainer_impl.h" EXCLUDE)  # the trainer's sources' own header
install(DIRECTORY ${PROJECT_SOURCE_DIR}/kernels/cpu/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kernels/cpu
  FILES_MATCHING PATTERN "*.h" PATTERN "*_api.inc")  # *_api.inc: the kernel declarations batchnorm.h etc. include
if(RENAISSANCE_HAVE_CUDA)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/kernels/cuda/
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kernels/cuda
    FILES_MATCHING PATTERN "*.h")
endif()

# ---- share/renaissance: what a user of an installed copy (Spack, a module) runs beside the binary ----------------
# jobs/ (the sbatch scripts), scripts/ (plot_metrics.py, the data and comparison scripts), models/ (model YAMLs) and
# recipes/ (run.yaml files for --config); scripts keep their executable bits. Not the scripts that work on a source
# checkout (they cd to the repository root: setup would make share/renaissance/.deps, test and quickstart look for
# CMakeLists.txt): they are for developers, not for a user of the install.
set(_rn_dev_scripts setup test quickstart check-spack-recipe make-release-tarball gpu-test fuzz sanitize)
foreach(_rn_share jobs scripts models recipes)
  set(_rn_excludes "")
  if(_rn_share STREQUAL "scripts")
    foreach(_rn_dev IN LISTS _rn_dev_scripts)
      list(APPEND _rn_excludes REGEX "/scripts/${_rn_dev}$" EXCLUDE)
    endforeach()
  endif()
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_rn_share}/
    DESTINATION ${CMAKE_INSTALL_DATADIR}/renaissance/${_rn_share}
    USE_SOURCE_PERMISSIONS
    PATTERN "__pycache__" EXCLUDE
    PATTERN "*.pyc" EXCLUDE
    ${_rn_excludes})
endforeach()
unset(_rn_excludes)
unset(_rn_dev_scripts)
unset(_rn_share)

# ---- package config ------------------------------------------------------------------------------
install(EXPORT RenaissanceTargets
  NAMESPACE Renaissance::
  FILE RenaissanceTargets.cmake
  DESTINATION ${RENAISSANCE_INSTALL_CMAKEDIR})

configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/RenaissanceConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/RenaissanceConfig.cmake
  INSTALL_DESTINATION ${RENAISSANCE_INSTALL_CMAKEDIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
# 0.x: a minor version bump may break the API.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/RenaissanceConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/cmake/RenaissanceConfig.cmake
  ${PROJECT_BINARY_DIR}/cmake/RenaissanceConfigVersion.cmake
  DESTINATION ${RENAISSANCE_INSTALL_CMAKEDIR})

unset(_rn_export_targets)
