#include "cli_errors.h"
#include "preflight.h"

#include "run_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <string>

namespace renaissance::app {

int edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment distance: Levenshtein plus swaps of two neighbours ("trian" -> "train" is 1).
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates) {
  if (word.empty()) return {};
  std::string best;
  int best_d = 1 << 30;
  for (const std::string& c : candidates) {
    const int d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  const int limit = std::max<int>(1, static_cast<int>(word.size()) / 3);
  if (best_d <= limit) return best;
  // A unique prefix ("--epo" -> "--epochs"), at least 3 characters beyond the dashes.
  const std::size_t dashes = word.find_first_not_of('-');
  if (dashes == std::string::npos || word.size() - dashes < 3) return {};
  std::string only;
  for (const std::string& c : candidates)
    if (c.size() > word.size() && c.compare(0, word.size(), word) == 0) {
      if (!only.empty()) return {};
      only = c;
    }
  return only;
}

namespace {

std::vector<std::string> subcommand_names(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) out.push_back(s->get_name());
  return out;
}

std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames()) out.push_back("--" + l);
    for (const std::string& s : o->get_snames()) out.push_back("-" + s);
  }
  return out;
}

std::vector<const CLI::App*> subcommands(const CLI::App& app) {
  std::vector<const CLI::App*> out;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) out.push_back(s);
  return out;
}

}  // namespace

std::string usage_error_text(const CLI::App& app, const std::vector<std::string>& args, const CLI::ParseError& e) {
  const std::string prog = app.get_name().empty() ? "renaissance" : app.get_name();
  std::string what = e.what();
  std::vector<std::string> hints;
  // Walk down the subcommands the command line names ("data import folder"); CLI11 takes the first word that
  // names a subcommand of the current level, and so do we.
  const CLI::App* level = &app;
  std::string path = prog;
  std::size_t i = 0;
  while (!subcommands(*level).empty()) {
    while (i < args.size() && (args[i].empty() || args[i][0] == '-')) ++i;
    const CLI::App* next = nullptr;
    if (i < args.size())
      for (const CLI::App* s : subcommands(*level))
        if (s->get_name() == args[i]) next = s;
    if (!next) {
      if (i < args.size()) {
        what = fmt::format("unknown command '{}'", args[i]);
        const std::string near = nearest_name(args[i], subcommand_names(*level));
        if (!near.empty()) hints.push_back(fmt::format("did you mean '{} {}'?", path, near));
      } else if (dynamic_cast<const CLI::RequiredError*>(&e) || dynamic_cast<const CLI::ExtrasError*>(&e)) {
        what = fmt::format("'{}' needs a command", path);
        // Options this level does not have (`renaissance --verison`).
        const std::vector<std::string> known = option_names(*level);
        for (const std::string& a : args) {
          if (a.size() < 2 || a[0] != '-' || a == "--") continue;
          const std::string name = a.substr(0, a.find('='));
          if (std::find(known.begin(), known.end(), name) != known.end()) continue;
          what = fmt::format("unknown option '{}'", name);
          const std::string near = nearest_name(name, known);
          if (!near.empty()) hints.push_back(fmt::format("'{}': did you mean '{}'?", name, near));
        }
      }
      hints.push_back(
          fmt::format("commands: {}; run '{} --help' for more", fmt::join(subcommand_names(*level), ", "), path));
      return fmt::format("{}: error: {}\n{}\n", prog, what, fmt::join(hints, "\n"));
    }
    level = next;
    path += " " + next->get_name();
    ++i;
  }
  // Every word after the subcommand that looks like an option it does not have.
  const std::vector<std::string> known = option_names(*level);
  std::vector<std::string> unknown;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a[0] != '-' || a == "--") continue;
    const std::string name = a.substr(0, a.find('='));
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    if (name == "--help" || name == "-h" || name == "--version") continue;
    if (std::isdigit(static_cast<unsigned char>(name[1])) || name[1] == '.') continue;  // a negative number
    const std::string near = nearest_name(name, known);
    unknown.push_back("'" + name + "'");
    hints.push_back(near.empty() ? fmt::format("'{}' is not an option of '{}'", name, path)
                                 : fmt::format("'{}': did you mean '{}'?", name, near));
  }
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr && !unknown.empty())
    what = fmt::format("unknown option{} {}", unknown.size() > 1 ? "s" : "", fmt::join(unknown, ", "));
  hints.push_back(fmt::format("run '{} --help' for its options", path));
  return fmt::format("{}: error: {}: {}\n{}\n", prog, level->get_name(), what, fmt::join(hints, "\n"));
}

CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::size_t used = 0;
        double value = 0.0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          return "'" + text + "' is not a size (a number with an optional unit: B, KiB, MiB, GiB, TiB)";
        }
        std::string unit = text.substr(used);
        for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        double scale = 0.0;
        if (unit.empty() || unit == "b") scale = 1.0;
        else if (unit == "k" || unit == "kib") scale = 1024.0;
        else if (unit == "m" || unit == "mib") scale = 1024.0 * 1024.0;
        else if (unit == "g" || unit == "gib") scale = 1024.0 * 1024.0 * 1024.0;
        else if (unit == "t" || unit == "tib") scale = 1024.0 * 1024.0 * 1024.0 * 1024.0;
        else
          return "'" + text + "': unknown unit '" + text.substr(used) + "' (B, KiB, MiB, GiB or TiB)";
        const double bytes = std::floor(value * scale);
        if (!(bytes >= 1.0) || bytes > 4.611686018427388e18)
          return "'" + text + "' is not a size from 1 byte to 2^62 bytes";
        text = std::to_string(static_cast<long long>(bytes));
        return {};
      },
      "SIZE");
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](const std::string& text) -> std::string {
        const std::string max = "18446744073709551615";  // 2^64 - 1
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        const std::string t = digits ? text.substr(std::min(text.find_first_not_of('0'), text.size() - 1)) : text;
        if (!digits || t.size() > max.size() || (t.size() == max.size() && t > max))
          return "'" + text + "' is not a seed (an integer from 0 to 2^64 - 1)";
        return {};
      },
      "UINT");
}

void read_integers_as_decimal(CLI::App& app) {
  const CLI::Validator decimal(
      [](std::string& text) -> std::string {
        const std::size_t sign = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
        std::size_t end = sign;  // "0010" -> "10", "-007" -> "-7", "00" -> "0"; "0x1f" stays hexadecimal
        while (end + 1 < text.size() && text[end] == '0' && std::isdigit(static_cast<unsigned char>(text[end + 1])))
          ++end;
        text.erase(sign, end - sign);
        return {};
      },
      "");
  // A decimal number past the option's 64 bits: CLI11 clamped it, and the command's own error then quoted
  // 9223372036854775807 for 99999999999999999999. Checked after the option's own checks (a seed's, a range's), which
  // say more; train's numbers are checked as written by check_train_numbers, after the parse.
  auto fits = [](bool is_signed) {
    return CLI::Validator(
        [is_signed](std::string& text) -> std::string {
          const std::size_t sign = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
          if (text.size() == sign || text.find_first_not_of("0123456789", sign) != std::string::npos) return {};
          errno = 0;
          if (is_signed)
            (void)std::strtoll(text.c_str(), nullptr, 10);
          else if (text[0] != '-')
            (void)std::strtoull(text.c_str(), nullptr, 10);
          return errno == ERANGE ? "'" + text + "' does not fit in a " + (is_signed ? "signed " : "") + "64-bit integer"
                                 : std::string();
        },
        "");
  };
  const bool train = app.get_name() == "train";
  for (CLI::Option* o : app.get_options()) {
    // CLI11 appends each check's description ("INT:INT in [1 - 65536]", "UINT:UINT"): the type is the first word.
    const std::string type = o->get_type_name().substr(0, o->get_type_name().find(':'));
    if (type != "INT" && type != "UINT") continue;
    o->transform(decimal);
    if (!(train && train_checks_as_written(o->get_name()))) o->check(fits(type == "INT"));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) read_integers_as_decimal(*sub);
}

void check_flags_and_paths(CLI::App& app) {
  // A flag takes what run.yaml's flags take, and 1/0: CLI11 read any integer after '=' (--ema=5 on, --no-validate=-5
  // off).
  const CLI::Validator boolean(
      [](std::string& text) -> std::string {
        return is_flag_word(text, /*digits=*/true)
                   ? std::string()
                   : "a flag is on or off: true/false (yes/no, on/off, 1/0), got '" + text + "'";
      },
      "");
  // A path option given an empty value was ignored without a word (--save "" trained and saved nothing).
  const CLI::Validator path(
      [](std::string& text) -> std::string { return text.empty() ? "needs a path, got an empty one" : ""; }, "");
  for (CLI::Option* o : app.get_options()) {
    const std::string name = o->get_name();
    if (name == "--help" || name == "-h" || name == "--version") continue;
    if (o->get_expected_max() == 0)
      o->check(boolean);
    else
      for (const char* p : {"--save", "--metrics", "--loss-log", "--checkpoint-dir", "--config", "--data",
                            "--model-file", "--weights", "--checkpoint", "--out", "--engine-cache"})
        if (name == p) o->check(path);
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) check_flags_and_paths(*sub);
}

CLI::Option* add_recompute_budget_option(CLI::App& cmd, std::int64_t& bytes) {
  return cmd
      .add_option("--recompute-budget", bytes,
                  "with --recompute bn-relu: recompute only as many BN -> ReLU outputs (in forward order) as bring the "
                  "plan's arena within this size (e.g. 5.5GiB, 900MiB, bytes; 1 KiB = 1024 B), keeping the rest; "
                  "default: recompute all")
      ->transform(byte_size());
}

CLI::Option* add_relu_mask_option(CLI::App& cmd, std::string& value) {
  return cmd
      .add_option("--relu-mask", value,
                  "--amp: on: a residual block's end also stores its ReLU's sign as a 1-bit mask, which the backward "
                  "reads instead of the FP16 output (one memory pass less, the same results bit for bit; ResNet-50 "
                  "b256: +165 MiB of arena); off: the backward reads the output")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
}

}  // namespace renaissance::app
