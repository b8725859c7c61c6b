# cmake -P script behind the install.find_package_consumer test (see CMakeLists.txt for the -D's).
cmake_minimum_required(VERSION 3.24)

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/consumer-build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(config_arg "")
if(CONFIG)
  set(config_arg --config "${CONFIG}")
endif()

# 1. install
run_step("cmake --install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" ${config_arg})
foreach(f bin/renaissance include/renaissance/core/dtensor.h share/renaissance/jobs/train-cpu.sbatch
    share/renaissance/scripts/plot_metrics.py share/renaissance/models/fmnist_cnn.yaml
    share/renaissance/recipes/fmnist-cnn-cpu.yaml)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "missing after install: ${prefix}/${f}")
  endif()
endforeach()
# the development scripts (they work on a source checkout only) are not installed
foreach(f setup test quickstart check-spack-recipe make-release-tarball gpu-test fuzz sanitize)
  if(EXISTS "${prefix}/share/renaissance/scripts/${f}")
    message(FATAL_ERROR "a development script was installed: ${prefix}/share/renaissance/scripts/${f}")
  endif()
endforeach()
# the scripts stay executable
foreach(f share/renaissance/jobs/train-cpu.sbatch share/renaissance/scripts/plot_metrics.py)
  execute_process(COMMAND test -x "${prefix}/${f}" RESULT_VARIABLE _x)
  if(NOT _x EQUAL 0)
    message(FATAL_ERROR "installed without its executable bit: ${prefix}/${f}")
  endif()
endforeach()
# every installed script that starts with #! is executable (docs/build.md says the scripts are)
file(GLOB_RECURSE _scripts "${prefix}/share/renaissance/scripts/*" "${prefix}/share/renaissance/jobs/*")
foreach(f IN LISTS _scripts)
  file(READ "${f}" _head LIMIT 16)
  if(_head MATCHES "^#!")
    execute_process(COMMAND test -x "${f}" RESULT_VARIABLE _x)
    if(NOT _x EQUAL 0)
      message(FATAL_ERROR "installed without its executable bit (it starts with #!): ${f}")
    endif()
  endif()
endforeach()
file(GLOB_RECURSE config_files "${prefix}/*/RenaissanceConfig.cmake" "${prefix}/*/RenaissanceConfigVersion.cmake")
list(LENGTH config_files n_config)
if(NOT n_config EQUAL 2)
  message(FATAL_ERROR "RenaissanceConfig.cmake / RenaissanceConfigVersion.cmake not installed under ${prefix}")
endif()

# 2. configure + build the consumer against the prefix only
set(build_type_arg "")
if(CONFIG)
  set(build_type_arg "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
set(cuda_arg "")
if(CUDA_ROOT)
  set(cuda_arg "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
endif()
run_step("consumer configure"
  "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${consumer_build}" -G "${GENERATOR}" ${build_type_arg}
  "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  "-DCMAKE_C_COMPILER=${C_COMPILER}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}" ${cuda_arg})
if(NOT step_output MATCHES "Renaissance_DIR=${prefix}/")
  message(FATAL_ERROR "the consumer did not find Renaissance in ${prefix}:\n${step_output}")
endif()
run_step("consumer build" "${CMAKE_COMMAND}" --build "${consumer_build}" ${config_arg})

# 3. run it: compute_slot_bytes(2x8x8x3, F16, I_A_DATA) = 2·(2·8·8·8) + 16 → 2064 → 2304
find_program(consumer_exe renaissance_consumer PATHS "${consumer_build}" PATH_SUFFIXES "${CONFIG}" NO_DEFAULT_PATH)
if(NOT consumer_exe)
  message(FATAL_ERROR "renaissance_consumer not built in ${consumer_build}")
endif()
run_step("consumer run" "${consumer_exe}")
message(STATUS "${step_output}")
if(NOT step_output MATCHES "compute_slot_bytes = 2304")
  message(FATAL_ERROR "unexpected consumer output:\n${step_output}")
endif()

# 4. the installed executable starts, and an installed recipe that names a model file (../models/...) trains one
# step from a directory outside the prefix and the source tree (it failed everywhere but the source root)
run_step("renaissance --help" "${prefix}/bin/renaissance" --help)
execute_process(COMMAND "${prefix}/bin/renaissance" data synthetic --out "${WORK_DIR}/tiny.h5" --train 16 --val 8
  --shape 28,28,1 --classes 10 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "renaissance data synthetic failed (${rc}):\n${out}")
endif()
execute_process(COMMAND "${prefix}/bin/renaissance" train
  --config "${prefix}/share/renaissance/recipes/fmnist-resnet18-narrow-cpu.yaml" --data "${WORK_DIR}/tiny.h5"
  --epochs 1 --max-steps 1 --batch 8 --val-batch 8
  WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "done: 1 steps")
  message(FATAL_ERROR "the installed recipe fmnist-resnet18-narrow-cpu.yaml did not train from ${WORK_DIR} (${rc}):\n${out}")
endif()

message(STATUS "install test passed (prefix ${prefix})")
