# Sources of lib/renaissance/blueprint (explicit list).
target_sources(renaissance PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/blueprint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/yaml.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zoo.cpp
)
