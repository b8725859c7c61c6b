# Element-wise, BN, pooling, loss, metrics and RANGE-op kernels (explicit list).
set(RENAISSANCE_POINTWISE_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/elementwise.cu
  ${CMAKE_CURRENT_LIST_DIR}/batchnorm.cu
  ${CMAKE_CURRENT_LIST_DIR}/pooling.cu
  ${CMAKE_CURRENT_LIST_DIR}/softmax_ce.cu
  ${CMAKE_CURRENT_LIST_DIR}/metrics.cu
  ${CMAKE_CURRENT_LIST_DIR}/range_ops.cu
  ${CMAKE_CURRENT_LIST_DIR}/optimizer.cu
  ${CMAKE_CURRENT_LIST_DIR}/augment.cu
)
target_sources(renaissance_kernels_cuda PRIVATE ${RENAISSANCE_POINTWISE_CUDA_SOURCES})
# No contraction into FMA: like kernels/cpu (-ffp-contract=off), every formula is evaluated as written, which is
# what lets the optimizer and range updates match the CPU kernels bit for bit. Host code gets the project's warnings.
set_source_files_properties(${RENAISSANCE_POINTWISE_CUDA_SOURCES} PROPERTIES COMPILE_OPTIONS
  "-fmad=false;-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter")
