# The layering of DESIGN §12, checked on the #include lines of the sources: a layer that includes a header of a layer
# it must not stops the configure step, naming the file, the line and the header.
#
#   include(RenaissanceLayering)   # from CMakeLists.txt: checks PROJECT_SOURCE_DIR
#   cmake -DRENAISSANCE_LAYERING_ROOT=<tree> -P cmake/RenaissanceLayering.cmake   # any tree (tests/layering)
#
# A layer's sources may include its own headers and those of the layers listed for it below (the libraries'
# PRIVATE/PUBLIC links in lib/renaissance/CMakeLists.txt follow the same table). Third-party and standard headers
# are not checked.

if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.24)
endif()

# Where each layer's files live (relative to the root) and what each may include.
set(RENAISSANCE_LAYER_DIRS
  "core=lib/renaissance/core"
  "ops=lib/renaissance/ops"
  "blueprint=lib/renaissance/blueprint"
  "plan=lib/renaissance/plan"
  "io=lib/renaissance/io"
  "runtime=lib/renaissance/runtime"
  "comm=lib/renaissance/comm"
  "kernels_cpu=kernels/cpu"
  "kernels_cuda=kernels/cuda"
  "app=app")
set(RENAISSANCE_LAYER_ALLOWED_core "")
set(RENAISSANCE_LAYER_ALLOWED_ops "core")
set(RENAISSANCE_LAYER_ALLOWED_blueprint "core;ops")
set(RENAISSANCE_LAYER_ALLOWED_plan "core;ops;blueprint")
set(RENAISSANCE_LAYER_ALLOWED_io "core")
set(RENAISSANCE_LAYER_ALLOWED_runtime "core;ops;blueprint;plan;io;kernels_cpu;kernels_cuda")
set(RENAISSANCE_LAYER_ALLOWED_comm "core")
set(RENAISSANCE_LAYER_ALLOWED_kernels_cpu "core;ops")
set(RENAISSANCE_LAYER_ALLOWED_kernels_cuda "core;ops")
set(RENAISSANCE_LAYER_ALLOWED_app "core;blueprint;plan;io;runtime;comm")

# The layer a header path such as "renaissance/plan/compiler.h" or "kernels/cuda/conv.h" belongs to (or "").
function(_rn_layer_of_include header out)
  set(layer "")
  if(header MATCHES "^renaissance/([a-z_]+)/")
    set(layer "${CMAKE_MATCH_1}")
  elseif(header MATCHES "^kernels/(cpu|cuda)/")
    set(layer "kernels_${CMAKE_MATCH_1}")
  endif()
  set(${out} "${layer}" PARENT_SCOPE)
endfunction()

# Fails (FATAL_ERROR) listing every forbidden #include under `root`.
function(renaissance_check_layering root)
  set(violations "")
  set(checked 0)
  foreach(entry IN LISTS RENAISSANCE_LAYER_DIRS)
    string(REPLACE "=" ";" entry "${entry}")
    list(GET entry 0 layer)
    list(GET entry 1 dir)
    if(NOT IS_DIRECTORY "${root}/${dir}")
      continue()
    endif()
    file(GLOB_RECURSE files RELATIVE "${root}" "${root}/${dir}/*.h" "${root}/${dir}/*.cpp" "${root}/${dir}/*.cu"
         "${root}/${dir}/*.cuh")
    set(allowed ${RENAISSANCE_LAYER_ALLOWED_${layer}} ${layer})
    foreach(f IN LISTS files)
      math(EXPR checked "${checked} + 1")
      file(STRINGS "${root}/${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
      foreach(line IN LISTS lines)
        if(NOT line MATCHES "#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"]")
          continue()
        endif()
        set(header "${CMAKE_MATCH_1}")
        _rn_layer_of_include("${header}" target_layer)
        if(target_layer STREQUAL "" OR target_layer IN_LIST allowed)
          continue()
        endif()
        string(REPLACE ";" ", " allowed_text "${RENAISSANCE_LAYER_ALLOWED_${layer}}")
        if(allowed_text STREQUAL "")
          set(allowed_text "nothing of ours")
        endif()
        list(APPEND violations "  ${f} includes <${header}>: ${layer} may include ${allowed_text}")
      endforeach()
    endforeach()
  endforeach()
  if(violations)
    list(LENGTH violations n)
    string(REPLACE ";" "\n" text "${violations}")
    message(FATAL_ERROR "layering (DESIGN §12, cmake/RenaissanceLayering.cmake): ${n} forbidden include(s):\n${text}\n")
  endif()
  message(STATUS "Renaissance: layering checked (${checked} files, DESIGN §12)")
endfunction()

if(CMAKE_SCRIPT_MODE_FILE)
  if(NOT RENAISSANCE_LAYERING_ROOT)
    message(FATAL_ERROR "usage: cmake -DRENAISSANCE_LAYERING_ROOT=<source tree> -P RenaissanceLayering.cmake")
  endif()
  renaissance_check_layering("${RENAISSANCE_LAYERING_ROOT}")
else()
  renaissance_check_layering("${PROJECT_SOURCE_DIR}")
endif()
