# Sources of lib/renaissance/blueprint (explicit list).
target_sources(renaissance_blueprint PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/blueprint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/yaml.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zoo.cpp
)
