# Sources of lib/renaissance/comm (explicit list): MPI bootstrap, communicators, watchdog.
target_sources(renaissance_comm PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/mpi_session.cpp
  ${CMAKE_CURRENT_LIST_DIR}/watchdog.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mpi_communicator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/communicator.cpp
)
if(RENAISSANCE_HAVE_CUDA)
  # NCCL: the CUDA toolkit's copy (/usr/local/cuda) or a system-wide one (the GPU machine's libnccl-dev).
  find_path(RENAISSANCE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{NCCL_HOME}/include)
  find_library(RENAISSANCE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} $ENV{NCCL_HOME}/lib)
  if(NOT RENAISSANCE_NCCL_INCLUDE_DIR OR NOT RENAISSANCE_NCCL_LIBRARY)
    message(FATAL_ERROR "NCCL (nccl.h, libnccl) not found: install libnccl-dev or set NCCL_HOME")
  endif()
  message(STATUS "Renaissance: NCCL ${RENAISSANCE_NCCL_LIBRARY}")
  target_sources(renaissance_comm PRIVATE ${CMAKE_CURRENT_LIST_DIR}/nccl_communicator.cpp)
  target_include_directories(renaissance_comm SYSTEM PRIVATE ${RENAISSANCE_NCCL_INCLUDE_DIR})
  target_link_libraries(renaissance_comm PRIVATE ${RENAISSANCE_NCCL_LIBRARY} CUDA::cudart)
endif()
