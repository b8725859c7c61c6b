# Sources of lib/renaissance/io (explicit list).
target_sources(renaissance_io PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/hdf5_util.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dataset.cpp
  ${CMAKE_CURRENT_LIST_DIR}/batch_loader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/importers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gzip_reader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/image.cpp
  ${CMAKE_CURRENT_LIST_DIR}/augment.cpp
  ${CMAKE_CURRENT_LIST_DIR}/loader_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pickle.cpp
  ${CMAKE_CURRENT_LIST_DIR}/import_folder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/import_cifar.cpp
  ${CMAKE_CURRENT_LIST_DIR}/weights.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensorboard.cpp
)
# The resampling and augmentation reference is specified operation by operation (image.h): no contracted
# multiply-adds, whatever flags the build adds.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/image.cpp ${CMAKE_CURRENT_LIST_DIR}/augment.cpp PROPERTIES COMPILE_OPTIONS -ffp-contract=off)
