module larder.invalid/benchmarks/delayline

go 1.22
