# The layering check (cmake/RenaissanceLayering.cmake) on small trees made here: an allowed tree passes, and each
# forbidden include makes the check fail naming the file and the header.
#   cmake -DCHECK=<RenaissanceLayering.cmake> -DWORK_DIR=<scratch> -P run_layering_test.cmake
cmake_minimum_required(VERSION 3.24)

function(run_check tree out_rc out_text)
  execute_process(COMMAND ${CMAKE_COMMAND} -DRENAISSANCE_LAYERING_ROOT=${tree} -P ${CHECK}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  set(${out_rc} "${rc}" PARENT_SCOPE)
  set(${out_text} "${o}${e}" PARENT_SCOPE)
endfunction()

# A tree of allowed includes, then `file` of it replaced by `text` (relative path, file content).
function(make_tree dir)
  file(REMOVE_RECURSE ${dir})
  file(WRITE ${dir}/lib/renaissance/core/shape.h "#pragma once\n#include <cstdint>\n")
  file(WRITE ${dir}/lib/renaissance/plan/compiler.h "#include <renaissance/core/shape.h>\n#include <renaissance/blueprint/blueprint.h>\n")
  file(WRITE ${dir}/lib/renaissance/runtime/trainer.h "#include <renaissance/plan/compiler.h>\n#include <kernels/cuda/conv.h>\n")
  file(WRITE ${dir}/lib/renaissance/comm/communicator.h "#include <renaissance/core/communicator.h>\n")
  file(WRITE ${dir}/app/main.cpp "#include \"commands.h\"\n#include <renaissance/runtime/trainer.h>\n#include <renaissance/comm/communicator.h>\n")
  file(WRITE ${dir}/kernels/cpu/conv2d.cpp "#include <kernels/cpu/conv2d.h>\n#include <renaissance/core/shape.h>\n")
endfunction()

set(good ${WORK_DIR}/good)
make_tree(${good})
run_check(${good} rc text)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the allowed tree failed the check:\n${text}")
endif()

# Each forbidden include of DESIGN §12, on its own: file, include line, what the message must name.
set(cases
  "lib/renaissance/plan/bad.cpp|#include <renaissance/runtime/trainer.h>|plan may include core, ops, blueprint"
  "lib/renaissance/comm/bad.h|  #  include \"renaissance/runtime/executor.h\"|comm may include core"
  "lib/renaissance/core/bad.h|#include <renaissance/plan/compiler.h>|core may include nothing of ours"
  "app/bad.cpp|#include <kernels/cuda/device_info.h>|app may include"
  "kernels/cpu/bad.cpp|#include <kernels/cuda/conv.h>|kernels_cpu may include core, ops"
  "lib/renaissance/io/bad.cpp|#include <renaissance/runtime/trainer.h>|io may include core")
set(i 0)
foreach(c IN LISTS cases)
  string(REPLACE "|" ";" c "${c}")
  list(GET c 0 file)
  list(GET c 1 line)
  list(GET c 2 expect)
  set(tree ${WORK_DIR}/bad${i})
  math(EXPR i "${i} + 1")
  make_tree(${tree})
  file(WRITE ${tree}/${file} "// forbidden\n${line}\n")
  run_check(${tree} rc text)
  if(rc EQUAL 0)
    message(FATAL_ERROR "the check passed a tree where ${file} has '${line}':\n${text}")
  endif()
  string(FIND "${text}" "${file} includes" at_file)
  string(FIND "${text}" "${expect}" at_rule)
  if(at_file LESS 0 OR at_rule LESS 0)
    message(FATAL_ERROR "the check failed on ${file} but its message does not name the file and the rule '${expect}':\n${text}")
  endif()
endforeach()
message(STATUS "layering test passed: the allowed tree passes, ${i} forbidden includes fail")
