// libFuzzer target: the pickle reader of the CIFAR importer (io/pickle.h) and the interpretation of what it returns
// as a CIFAR batch (a dict with a numpy uint8 array and a label list: io::read_cifar_batch, what the importer runs on
// each member). Every input must end in a value or a renaissance::Error: no crash, no unbounded allocation.
#include "fuzz_util.h"

#include <renaissance/io/importers.h>
#include <renaissance/io/pickle.h>

#include <cstdint>
#include <string>

using namespace renaissance;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::expect_clean(
      [&] {
        const io::pickle::Document doc = io::pickle::load(data, size, "fuzz.pkl");
        std::string bytes;
        for (const char* key : {"data", "labels", "fine_labels", "label_names"})
          if (const io::pickle::Value* x = doc.root().get(key)) {
            (void)io::pickle::as_bytes(*x, bytes);
            if (x->state) (void)io::pickle::as_bytes(*x->state, bytes);
            for (const io::pickle::Value* item : x->items) (void)io::pickle::as_bytes(*item, bytes);
          }
      },
      "fuzz_pickle");
  // The importer's reading of a batch member (numpy array forms, shape and byte-count checks, labels), as CIFAR-10's
  // and CIFAR-100's.
  for (const auto& variant : {std::pair{"labels", 10}, std::pair{"fine_labels", 100}})
    fuzz::expect_clean([&] { (void)io::read_cifar_batch(data, size, "fuzz.pkl", variant.first, variant.second); },
                       "fuzz_pickle");
  return 0;
}
