#include <renaissance/blueprint/yaml.h>
