# cuDNN convolutions and cuBLASLt fully connected layers (explicit list).
set(RENAISSANCE_DNN_CXX_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/dnn_handles.cpp
  ${CMAKE_CURRENT_LIST_DIR}/conv.cpp
  ${CMAKE_CURRENT_LIST_DIR}/conv_graph.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fc.cpp)
set(RENAISSANCE_DNN_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/dnn_bias.cu
  ${CMAKE_CURRENT_LIST_DIR}/depthwise.cu)
target_sources(renaissance_kernels_cuda PRIVATE ${RENAISSANCE_DNN_CXX_SOURCES} ${RENAISSANCE_DNN_CUDA_SOURCES})
# Warnings on for these files (the library target itself does not link renaissance_warnings).
set_source_files_properties(${RENAISSANCE_DNN_CXX_SOURCES} PROPERTIES COMPILE_OPTIONS "-Wall;-Wextra")
set_source_files_properties(${RENAISSANCE_DNN_CUDA_SOURCES} PROPERTIES COMPILE_OPTIONS "-Xcompiler=-Wall,-Wextra")
# Only conv_graph.cpp sees cudnn-frontend (a system include: its headers are not ours to warn about).
set_property(SOURCE ${CMAKE_CURRENT_LIST_DIR}/conv_graph.cpp APPEND PROPERTY COMPILE_OPTIONS
  -isystem ${RENAISSANCE_CUDNN_FRONTEND_INCLUDE_DIR})
