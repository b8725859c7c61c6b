// The project's way to include spdlog: every log call goes through the one logger main() installs (stderr, named
// "renaissance"), never a second one.
//
// spdlog is used as a compiled library (the spdlog::spdlog target: SPDLOG_COMPILED_LIB). A file compiled without
// that target's definitions gets spdlog's header-only code, with a registry and default logger of its own: on
// Ubuntu 24.04's spdlog 1.12 those log lines went to stdout, into `bench --json` output. So such a file does not
// compile: link spdlog::spdlog to its target.
#pragma once

#include <spdlog/spdlog.h>

#ifdef SPDLOG_HEADER_ONLY
#error "spdlog included without the spdlog::spdlog target's definitions: link spdlog::spdlog to this target"
#endif
