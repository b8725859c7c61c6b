#include <renaissance/blueprint/zoo.h>
