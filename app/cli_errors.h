// Usage errors the way users know them from git, argparse and torchrun: `renaissance: error: ...`, a "did you mean"
// for a near-miss subcommand or option, exit 2; a bare `renaissance` prints the help.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace renaissance::app {

/// Exit status of every usage error (unknown or malformed option, missing value, unknown subcommand): 2, as
/// argparse, getopt-based tools and Slurm's own commands use.
inline constexpr int kExitUsage = 2;

/// Edit distance (insertions, deletions, substitutions, adjacent transpositions) between two words.
int edit_distance(const std::string& a, const std::string& b);

/// The candidate nearest to `word` when it is near enough to be a typo (distance <= max(1, |word| / 3), or a
/// unique prefix); empty otherwise.
std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates);

/// The text of a usage error of `app` for the command line `args` (argv[1..], after MPI took its own) and the CLI11
/// error `e`: "renaissance: error: <what>", then "did you mean ...?" lines and where to find the options.
std::string usage_error_text(const CLI::App& app, const std::vector<std::string>& args, const CLI::ParseError& e);

/// A size in bytes as users write it: a number (decimals allowed) with an optional binary unit, B, K/KiB, M/MiB,
/// G/GiB or T/TiB (any case; 1 KiB = 1024 B): "5.75GiB", "900MiB", "1048576". Rewrites the value to whole bytes
/// (rounded down); anything else, zero or more than 2^62 bytes is a usage error naming the option.
CLI::Validator byte_size();
/// A seed: decimal digits only, from 0 to 2^64 - 1. CLI11 turns "-1" or a number past 2^64 into 2^64 - 1 without a
/// word; this refuses them with what was written.
CLI::Validator seed_value();

/// Every integer option of `app` and its subcommands reads its value in decimal: CLI11 converts with base 0, so
/// "--epochs 010" trained 8 epochs (octal) and "09" was refused; leading zeros are dropped before the conversion
/// ("0x14" stays hexadecimal), also for run.yaml values, which go through the same options. Call after every option
/// is registered.
void read_integers_as_decimal(CLI::App& app);

/// Every flag of `app` and its subcommands takes only true/false (yes/no, on/off, y/n, 1/0) after '=', and the path
/// options (--save, --data, --out, ...) refuse an empty value: a usage error (exit 2) naming the option.
void check_flags_and_paths(CLI::App& app);

/// `--recompute-budget SIZE` (train, bench, plan) into `bytes` (0 when not given).
CLI::Option* add_recompute_budget_option(CLI::App& cmd, std::int64_t& bytes);

/// `--relu-mask on|off` (train, bench, plan; plan::TrainConfig::relu_masks) into `value`.
CLI::Option* add_relu_mask_option(CLI::App& cmd, std::string& value);

}  // namespace renaissance::app
