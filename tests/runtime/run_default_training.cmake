# Runs the default `renaissance train` in WORKDIR (so it imports Fashion-MNIST into WORKDIR/data on first use)
# and checks the last epoch's val_top1 in the metrics JSONL against MIN_TOP1.
# Where the data set is not installed (a Spack install's `--test=root` on a site without Debian's package) the test
# skips; in CI (CI=true), whose scripts/setup installs it, a missing data set is a failure.
if(NOT EXISTS /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz)
  if("$ENV{CI}" STREQUAL "true")
    message(FATAL_ERROR "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist; scripts/setup does)")
  endif()
  message("SKIP: Fashion-MNIST is not installed in /usr/share/datasets/fashion-mnist (apt-get install "
          "dataset-fashion-mnist)")
  return()
endif()
file(MAKE_DIRECTORY ${WORKDIR})
execute_process(COMMAND ${CLI} train --metrics metrics.jsonl WORKING_DIRECTORY ${WORKDIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "renaissance train exited with ${rc}")
endif()
file(STRINGS ${WORKDIR}/metrics.jsonl lines)
list(GET lines -1 last)
string(REGEX MATCH "\"val_top1\":([0-9.]+)" _ "${last}")
set(top1 ${CMAKE_MATCH_1})
if(top1 STREQUAL "" OR top1 LESS ${MIN_TOP1})
  message(FATAL_ERROR "val_top1 ${top1} is below ${MIN_TOP1}")
endif()
message("val_top1 ${top1} >= ${MIN_TOP1}")
